// End-to-end tests of elastic training (real processes under kolo run --elastic): a rank
// SIGKILLed mid-run leaves the others to finish in the same processes, every sample of each
// epoch is trained on exactly once, and the weights equal one device's fed the same global
// batches; a rank started in a lost one's place joins and finishes with them; falling below
// --min-ranks stops the job with an error that says so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kolo/safetensors.h"
#include "../cli/run_kolo.h"
#include "../cli/weights.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::RunResult;
using kolo::testing::relativeDifference;
using kolo::testing::runKolo;

class ElasticCliTest : public ::testing::Test {
 public:
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string kolo() { return std::string(KOLO_BINARY_DIR) + "/src/cli/kolo"; }

 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_elastic_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

// 120 samples, global batch 12: 10 steps an epoch; 25 steps cover two epochs and a half.
constexpr int kSamples = 120, kBatch = 12, kStepsPerEpoch = 10, kSteps = 25;
const std::string kCommon =
    "train --model mlp --batch 12 --optimizer sgd --lr 0.05 --quiet --seed 3 "
    "--train-limit 120 --steps 25";

struct StepRecord {
  int64_t generation = -1;
  std::vector<int64_t> ids;  // the union over the ranks of that generation
};

// What a run that lost `killed` (launch ranks, before step `killStep`) must show: each rank
// one process throughout, the killed ranks with no step from `killStep` on and the survivors
// ending in generation `generation` or later (on a loaded machine a slow step may time out
// and regroup the same members once more); the ranks started in the killed ones' places
// (launch ranks `ranks`, `ranks` + 1, ...) that were admitted finishing with the survivors; every step's
// global batch complete in the newest generation that completed it; every sample of each
// epoch used exactly once; the weights of one device; and the changes in the metrics.
// Returns the launch ranks that joined.
std::set<int> expectElasticRun(const ElasticCliTest& test, const std::set<int>& killed, int killStep,
                               int64_t generation, int ranks = 4) {
  std::map<int64_t, StepRecord> steps;  // per step, the newest generation's samples over the ranks
  int64_t last = 0;
  std::set<int> joiners;  // replacements that trained (wrote a sample log)
  const int launched = ranks + static_cast<int>(killed.size());
  for (int rank = 0; rank < launched; ++rank) {
    std::ifstream in(test.file("samples") + ".rank-" + std::to_string(rank));
    if (rank >= ranks && !in.good()) continue;  // a replacement the job finished without
    EXPECT_TRUE(in.good()) << "rank " << rank;
    if (!in.good()) return {};
    if (rank >= ranks) joiners.insert(rank);
    std::string line;
    int pids = 0;
    int64_t lastStep = -1, lastGeneration = -1;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      if (line.rfind("pid ", 0) == 0) {
        ++pids;
        continue;
      }
      int64_t g, step;
      words >> g >> step;
      lastStep = std::max(lastStep, step);
      lastGeneration = std::max(lastGeneration, g);
      StepRecord& record = steps[step];
      if (g < record.generation) continue;
      if (g > record.generation) record = StepRecord{g, {}};
      for (int64_t id; words >> id;) record.ids.push_back(id);
    }
    // One process wrote the whole file: no rank was restarted.
    EXPECT_EQ(pids, 1) << "rank " << rank;
    if (killed.count(rank)) {
      EXPECT_LT(lastStep, killStep) << "rank " << rank;
    } else {
      EXPECT_EQ(lastStep, kSteps - 1) << "rank " << rank;
      EXPECT_GE(lastGeneration, generation) << "rank " << rank;
      if (last == 0) last = lastGeneration;
      EXPECT_EQ(lastGeneration, last) << "rank " << rank;
    }
  }
  EXPECT_EQ(steps.size(), static_cast<size_t>(kSteps));
  std::map<int64_t, std::map<int64_t, int>> perEpoch;  // epoch -> sample id -> uses
  for (const auto& [step, record] : steps) {
    EXPECT_EQ(record.ids.size(), static_cast<size_t>(kBatch)) << "step " << step;
    for (int64_t id : record.ids) ++perEpoch[step / kStepsPerEpoch][id];
  }
  for (const auto& [epoch, uses] : perEpoch) {
    const size_t expected = epoch < 2 ? kSamples : kSamples / 2;
    EXPECT_EQ(uses.size(), expected) << "epoch " << epoch;
    for (const auto& [id, count] : uses) EXPECT_EQ(count, 1) << "epoch " << epoch << " id " << id;
  }

  const auto expected = kolo::checkpoint::loadSafetensors(test.file("one.safetensors")).tensors;
  const auto got = kolo::checkpoint::loadSafetensors(test.file("elastic.safetensors")).tensors;
  EXPECT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first);
    EXPECT_LE(relativeDifference(expected[i].second.toFloatVector(), got[i].second.toFloatVector()),
              1e-5)
        << got[i].first;
  }

  // The metrics: the changes name the lost and the joined ranks; the run ends with the
  // survivors and the joiners.
  std::ifstream metrics(test.file("metrics.jsonl"));
  std::set<int> lostNamed, joinedNamed;
  int worldSize = 0;
  bool recovered = false;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.value("event", "") == "membership") {
      std::istringstream ids(record["lost"].get<std::string>());
      for (std::string id; std::getline(ids, id, ',');) lostNamed.insert(std::stoi(id));
      EXPECT_LE(record["step"].get<int>(), killStep);
    }
    if (record.value("event", "") == "joined") {
      std::istringstream ids(record["joined"].get<std::string>());
      for (std::string id; std::getline(ids, id, ',');) joinedNamed.insert(std::stoi(id));
      EXPECT_GE(record["step"].get<int>(), killStep);
    }
    if (record.value("final", false)) worldSize = record["world_size"];
    if (record.value("event", "") == "recovered") {
      recovered = true;
      EXPECT_GT(record["since_kill_s"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(lostNamed, killed);
  EXPECT_EQ(joinedNamed, joiners);
  EXPECT_EQ(worldSize, ranks - static_cast<int>(killed.size()) + static_cast<int>(joiners.size()));
  EXPECT_TRUE(recovered);
  return joiners;
}

// 4 ranks (or `ranks`, with --min-ranks `minRanks`) under kolo run --elastic with the test's
// sample log, metrics and saved weights; `debug` adds the --debug-* options. Also writes the
// one-device reference weights.
RunResult runElastic(const ElasticCliTest& test, const std::string& debug, int ranks = 4, int minRanks = 2) {
  const RunResult reference = runKolo(kCommon + " --save " + test.file("one.safetensors"));
  EXPECT_EQ(reference.exitCode, 0) << reference.output;
  return runKolo("run --elastic --min-ranks " + std::to_string(minRanks) + " -n " + std::to_string(ranks) +
                 " --timeout 5 -- " + ElasticCliTest::kolo() + " " +
                 kCommon + " --strategy multi-worker-mirrored " + debug + " --debug-sample-log " +
                 test.file("samples") + " --metrics " + test.file("metrics.jsonl") + " --save " +
                 test.file("elastic.safetensors"));
}

TEST_F(ElasticCliTest, SurvivorsOfASigkillFinishWithOneDeviceWeights) {
  const RunResult run = runElastic(*this, "--debug-kill-rank 1:7");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("the elastic job goes on with 3 rank(s)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("membership changed"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("lost_ranks=1"), std::string::npos) << run.output;
  expectElasticRun(*this, {1}, 7, 1);
}

// A rank started in the killed one's place (launch rank 4) registers once it has loaded
// its data; the members admit it at a step boundary (at the latest before step 8, where
// they wait for it) or in the membership change itself, mid-epoch, and it finishes with
// them from the state it received by broadcast: every sample once, one device's weights.
TEST_F(ElasticCliTest, AJoinerIsAdmittedMidEpochAfterASigkill) {
  const RunResult run = runElastic(*this, "--debug-kill-rank 1:5 --debug-await-join 8");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("starting rank 4 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("in the place of rank 1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("joined_ranks=4"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("elastic: joined rank=4"), std::string::npos) << run.output;
  EXPECT_EQ(expectElasticRun(*this, {1}, 5, 1), std::set<int>{4});
  // Admitted at step 5 (in the change after the kill) to 8: mid-epoch.
  std::ifstream in(file("samples") + ".rank-4");
  std::string line;
  std::getline(in, line);  // pid
  ASSERT_TRUE(std::getline(in, line));
  const int first = std::stoi(line.substr(line.find(' ') + 1));
  EXPECT_GE(first, 5);
  EXPECT_LE(first, 8);
}

// 2 ranks, --min-ranks 1: rank 0 sees its peer's death at once; the replacement (launch
// rank 2) registers once it has loaded its data, and rank 0 admits it at a step boundary:
// in the membership change after the kill (generation 1 from step 5), when it registered
// before that change ended (on a quiet machine it starts and loads its 120 samples in a
// fraction of a second), or at a later step boundary, before step 8 at the latest, where it
// waits for it: generation 2 from step 5 (registered while generation 1 formed, admitted at
// the boundary before step 5 is run again) to 8 (as on a loaded machine).
TEST_F(ElasticCliTest, AJoinerIsAdmittedAtAStepBoundary) {
  const RunResult run = runElastic(*this, "--debug-kill-rank 1:5 --debug-await-join 8", 2, 1);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("starting rank 2 (pid"), std::string::npos) << run.output;
  EXPECT_EQ(expectElasticRun(*this, {1}, 5, 1, 2), std::set<int>{2});
  std::ifstream in(file("samples") + ".rank-2");
  std::string line;
  std::getline(in, line);  // pid
  ASSERT_TRUE(std::getline(in, line));
  std::istringstream words(line);
  int64_t generation = -1, first = -1;
  words >> generation >> first;
  EXPECT_TRUE((generation == 1 && first == 5) || (generation == 2 && first >= 5 && first <= 8))
      << "the joiner's first step: " << line;
}

TEST_F(ElasticCliTest, TwoRanksKilledAtOnce) {
  const RunResult run = runElastic(*this, "--debug-kill-rank 1,2:7");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("the elastic job goes on with 2 rank(s)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("lost_ranks=1,2"), std::string::npos) << run.output;
  expectElasticRun(*this, {1, 2}, 7, 1);
}

// Rank 2 dies once generation 1 ({0, 2, 3}, with rank 1's replacement when it registered
// in time) is agreed, before its communicator is built: the others' rendezvous fails and
// they form generation 2 without rank 2 in the same change.
TEST_F(ElasticCliTest, RankKilledDuringTheMembershipChange) {
  const RunResult run = runElastic(*this, "--debug-kill-rank 1:7 --debug-kill-in-regroup 2");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("rank 2 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("lost_ranks=1,2"), std::string::npos) << run.output;
  expectElasticRun(*this, {1, 2}, 7, 2);
}

// --balance under --elastic: launch rank 2 is slowed 3x, so the split is uneven before and
// after rank 1 dies; every sample is still used once and the weights are one device's.
TEST_F(ElasticCliTest, BalancedSurvivorsOfASigkillFinishWithOneDeviceWeights) {
  const RunResult run =
      runElastic(*this, "--balance --balance-every 2 --debug-slow-rank 2:3 --debug-kill-rank 1:7");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("balance: new split"), std::string::npos) << run.output;
  expectElasticRun(*this, {1}, 7, 1);
}

// Falling below --min-ranks stops the job with an error that says so, after the survivor
// wrote a checkpoint of the last step every member completed; `kolo train --resume` on one
// device continues it to the weights of an uninterrupted one-device run.
TEST_F(ElasticCliTest, FallingBelowMinRanksWritesACheckpointThatResumes) {
  const RunResult reference = runKolo(kCommon + " --save " + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;
  const RunResult run = runKolo("run --elastic --min-ranks 2 -n 2 --timeout 3 -- " + kolo() + " " +
                                kCommon + " --strategy multi-worker-mirrored --debug-kill-rank 1:7 " +
                                "--checkpoint-dir " + file("checkpoints"));
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("killed by signal 9 (SIGKILL); 1 rank(s) left, below --min-ranks 2"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("1 rank(s) left after losing rank(s) 1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("checkpoint written before stopping"), std::string::npos) << run.output;

  const RunResult resumed =
      runKolo(kCommon + " --resume " + file("checkpoints") + " --save " + file("resumed.safetensors"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step=7"), std::string::npos) << resumed.output;
  const auto expected = kolo::checkpoint::loadSafetensors(file("one.safetensors")).tensors;
  const auto got = kolo::checkpoint::loadSafetensors(file("resumed.safetensors")).tensors;
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(relativeDifference(expected[i].second.toFloatVector(), got[i].second.toFloatVector()),
              1e-5)
        << got[i].first;
}

// --checkpoint-every under --elastic: rank 0 writes the checkpoints a run without --elastic
// writes; both ranks die before step 13, after those of steps 5 and 10, and the job fails.
// `kolo run --elastic ... --resume` continues from step 10 to the weights of an
// uninterrupted one-device run (with momentum: the optimizer state comes back too).
TEST_F(ElasticCliTest, CheckpointEveryAndResumeContinueAnUninterruptedRun) {
  const std::string train = kCommon + " --momentum 0.9";
  const RunResult reference = runKolo(train + " --save " + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;
  const std::string elastic = "run --elastic -n 2 --timeout 5 -- " + kolo() + " " + train +
                              " --strategy multi-worker-mirrored ";
  const RunResult killed = runKolo(elastic + "--debug-kill-rank 0,1:13 --checkpoint-every 5 " +
                                   "--checkpoint-dir " + file("checkpoints"));
  EXPECT_NE(killed.exitCode, 0) << killed.output;
  ASSERT_TRUE(fs::exists(file("checkpoints") + "/ckpt-000000010")) << killed.output;
  EXPECT_FALSE(fs::exists(file("checkpoints") + "/ckpt-000000015")) << killed.output;

  const RunResult resumed = runKolo(elastic + "--resume " + file("checkpoints") + " --save " +
                                    file("resumed.safetensors"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming checkpoint=" + file("checkpoints") + "/ckpt-000000010 step=10"),
            std::string::npos)
      << resumed.output;
  const auto expected = kolo::checkpoint::loadSafetensors(file("one.safetensors")).tensors;
  const auto got = kolo::checkpoint::loadSafetensors(file("resumed.safetensors")).tensors;
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(relativeDifference(expected[i].second.toFloatVector(), got[i].second.toFloatVector()),
              1e-5)
        << got[i].first;
}

// What an elastic job would silently leave out is refused by name.
TEST_F(ElasticCliTest, CompressionAndOverlapAreRefusedByName) {
  for (const std::string flag : {"--compress fp16", "--overlap on", "--shard-optimizer on"}) {
    const RunResult run =
        runKolo("run --elastic -n 2 -- " + kolo() + " " + kCommon + " --strategy multi-worker-mirrored " + flag);
    EXPECT_EQ(run.exitCode, 2) << flag << ": " << run.output;
    EXPECT_NE(run.output.find("not available under kolo run --elastic"), std::string::npos) << run.output;
  }
}

TEST_F(ElasticCliTest, MaxRanksBelowTheRankCountIsRefused) {
  const RunResult run = runKolo("run --elastic --max-ranks 1 -n 2 -- " + kolo() + " " + kCommon);
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("--max-ranks 1 is below -n 2"), std::string::npos) << run.output;
}

TEST_F(ElasticCliTest, NodesMinMaxNeedElastic) {
  const RunResult run = runKolo("run --nnodes 1:2 -n 2 --store 127.0.0.1:1 -- " + kolo() + " " + kCommon);
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("--nnodes 1:2: MIN:MAX needs --elastic"), std::string::npos) << run.output;
}

TEST_F(ElasticCliTest, MinRanksAboveTheRankCountIsRefused) {
  const RunResult run = runKolo("run --elastic --min-ranks 3 -n 2 -- " + kolo() + " " + kCommon);
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("--min-ranks 3 must be within 1..2"), std::string::npos) << run.output;
}

}  // namespace
