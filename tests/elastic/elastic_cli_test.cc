// End-to-end tests of elastic training (real processes under kolo run --elastic): a rank
// SIGKILLed mid-run leaves the others to finish in the same processes, every sample of each
// epoch is trained on exactly once, and the weights equal one device's fed the same global
// batches; falling below --min-ranks stops the job with an error that says so.
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
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::RunResult;
using kolo::testing::runKolo;

double relativeDifference(const std::vector<float>& reference, const std::vector<float>& other) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(reference[i]) - other[i]));
    scale = std::max(scale, std::abs(static_cast<double>(reference[i])));
  }
  return diff / std::max(scale, 1e-30);
}

class ElasticCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_elastic_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string kolo() { return std::string(KOLO_BINARY_DIR) + "/src/cli/kolo"; }
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

TEST_F(ElasticCliTest, SurvivorsOfASigkillFinishWithOneDeviceWeights) {
  const RunResult reference = runKolo(kCommon + " --save " + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;

  const int killed = 1, killStep = 7;
  const RunResult run = runKolo(
      "run --elastic --min-ranks 2 -n 4 --timeout 3 -- " + kolo() + " " + kCommon +
      " --strategy multi-worker-mirrored --debug-kill-rank " + std::to_string(killed) + ":" +
      std::to_string(killStep) + " --debug-sample-log " + file("samples") + " --metrics " +
      file("metrics.jsonl") + " --save " + file("elastic.safetensors"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("the elastic job goes on with 3 rank(s)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("membership changed"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("lost_ranks="), std::string::npos) << run.output;

  // Per step, the samples of the newest generation that completed it, over every rank.
  std::map<int64_t, StepRecord> steps;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(file("samples") + ".rank-" + std::to_string(rank));
    ASSERT_TRUE(in.good()) << "rank " << rank;
    std::string line;
    int pids = 0;
    std::set<int64_t> generations;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      if (line.rfind("pid ", 0) == 0) {
        ++pids;
        continue;
      }
      int64_t generation, step;
      words >> generation >> step;
      generations.insert(generation);
      StepRecord& record = steps[step];
      if (generation < record.generation) continue;
      if (generation > record.generation) record = StepRecord{generation, {}};
      for (int64_t id; words >> id;) record.ids.push_back(id);
    }
    // One process wrote the whole file: no rank was restarted.
    EXPECT_EQ(pids, 1) << "rank " << rank;
    if (rank == killed) {
      EXPECT_EQ(generations, std::set<int64_t>{0});
    } else {
      EXPECT_EQ(generations, (std::set<int64_t>{0, 1})) << "rank " << rank;
    }
  }
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  std::map<int64_t, std::map<int64_t, int>> perEpoch;  // epoch -> sample id -> uses
  for (const auto& [step, record] : steps) {
    EXPECT_EQ(record.ids.size(), static_cast<size_t>(kBatch)) << "step " << step;
    EXPECT_EQ(record.generation, step < killStep ? 0 : 1) << "step " << step;
    for (int64_t id : record.ids) ++perEpoch[step / kStepsPerEpoch][id];
  }
  for (const auto& [epoch, uses] : perEpoch) {
    const size_t expected = epoch < 2 ? kSamples : kSamples / 2;
    EXPECT_EQ(uses.size(), expected) << "epoch " << epoch;
    for (const auto& [id, count] : uses) EXPECT_EQ(count, 1) << "epoch " << epoch << " id " << id;
  }

  const auto expected = kolo::checkpoint::loadSafetensors(file("one.safetensors")).tensors;
  const auto got = kolo::checkpoint::loadSafetensors(file("elastic.safetensors")).tensors;
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first);
    EXPECT_LE(relativeDifference(expected[i].second.toFloatVector(), got[i].second.toFloatVector()),
              1e-5)
        << got[i].first;
  }

  // The metrics show the change: generation 1 of 3 ranks, rank 1 lost.
  std::ifstream metrics(file("metrics.jsonl"));
  bool membership = false, recovered = false;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.value("event", "") == "membership") {
      membership = true;
      EXPECT_EQ(record["generation"], 1);
      EXPECT_EQ(record["world_size"], 3);
      EXPECT_EQ(record["lost"], "1");
      EXPECT_EQ(record["step"], killStep);
    }
    if (record.value("event", "") == "recovered") {
      recovered = true;
      EXPECT_GT(record["since_kill_s"].get<double>(), 0.0);
    }
  }
  EXPECT_TRUE(membership);
  EXPECT_TRUE(recovered);
}

TEST_F(ElasticCliTest, FallingBelowMinRanksIsAClearError) {
  const RunResult run = runKolo("run --elastic --min-ranks 2 -n 2 --timeout 3 -- " + kolo() + " " +
                                kCommon + " --strategy multi-worker-mirrored --debug-kill-rank 1:2");
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("killed by signal 9 (SIGKILL); 1 rank(s) left, below --min-ranks 2"),
            std::string::npos)
      << run.output;
}

TEST_F(ElasticCliTest, MinRanksAboveTheRankCountIsRefused) {
  const RunResult run = runKolo("run --elastic --min-ranks 3 -n 2 -- " + kolo() + " " + kCommon);
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("--min-ranks 3 must be within 1..2"), std::string::npos) << run.output;
}

}  // namespace
