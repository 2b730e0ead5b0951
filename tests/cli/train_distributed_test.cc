// End-to-end tests of the distributed `kolo train` (real processes): the strategies give the
// same weights as one device, also with bf16 products; an interrupted run resumed from its checkpoints ends with the
// uninterrupted run's weights, skipping a corrupt newest checkpoint by name; a failing rank
// under --workers stops the job and is named.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kolo/data.h"
#include "kolo/safetensors.h"
#include "run_kolo.h"
#include "weights.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::RunResult;
using kolo::testing::runKolo;

using kolo::testing::loadWeights;
using kolo::testing::relativeDifference;
using kolo::testing::Weights;

class TrainDistributedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_dist_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(TrainDistributedTest, StrategiesGiveTheSameWeightsAsOneDevice) {
  // 10 SGD steps, global batch 64, file order: every strategy computes the same updates.
  const std::string common =
      "train --model mlp --no-shuffle --batch 64 --optimizer sgd --lr 0.05 --quiet "
      "--train-limit 2048 --steps ";
  const RunResult reference = runKolo(common + "10 --save " + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;
  const Weights expected = loadWeights(file("one.safetensors"));
  ASSERT_EQ(expected.size(), 6u);

  const std::vector<std::pair<std::string, std::string>> variants = {
      {"workers2", "--workers 2"},
      {"workers2_sharded", "--workers 2 --shard-optimizer on"},
      {"workers2_whole", "--workers 2 --shard-optimizer off"},
      {"one_inline_loader", "--prefetch off"},
      {"workers2_loader_thread", "--workers 2 --prefetch on"},
      {"workers2_tree", "--workers 2 --strategy multi-worker-mirrored --algo tree"},
      {"mirrored2", "--strategy mirrored --replicas 2"},
      {"mirrored4_reduce_to_one", "--strategy mirrored --replicas 4 --reduction reduce-to-one"},
      {"central2", "--strategy central-storage --replicas 2"},
  };
  for (const auto& [name, flags] : variants) {
    const RunResult run =
        runKolo(common + "10 --save " + file(name + ".safetensors") + " " + flags);
    ASSERT_EQ(run.exitCode, 0) << name << ":\n" << run.output;
    const Weights got = loadWeights(file(name + ".safetensors"));
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first);
      ASSERT_EQ(got[i].second.size(), expected[i].second.size());
      EXPECT_LE(relativeDifference(expected[i].second, got[i].second), 1e-5)
          << name << " " << got[i].first;
    }
  }
  // Under kolo run -n 2 without --strategy the ranks train as multi-worker-mirrored.
  const RunResult job = runKolo("run -n 2 -- " + std::string(KOLO_BINARY_DIR) + "/src/cli/kolo " + common +
                                "10 --save " + file("run2.safetensors"));
  ASSERT_EQ(job.exitCode, 0) << job.output;
  const Weights fromJob = loadWeights(file("run2.safetensors"));
  ASSERT_EQ(fromJob.size(), expected.size());
  for (size_t i = 0; i < fromJob.size(); ++i)
    EXPECT_LE(relativeDifference(expected[i].second, fromJob[i].second), 1e-5) << "run -n 2 " << fromJob[i].first;
  EXPECT_NE(job.output.find("strategy=multi-worker-mirrored"), std::string::npos) << job.output;
  // The runs trained: the weights moved away from the seeded initialisation.
  ASSERT_EQ(runKolo(common + "1 --save " + file("one_step.safetensors")).exitCode, 0);
  EXPECT_GT(
      relativeDifference(expected[0].second, loadWeights(file("one_step.safetensors"))[0].second),
      1e-4);
}

// --precision bf16 reaches every rank and every replica thread: 2 ranks and 2 mirrored
// replicas give one device's bf16 weights to float tolerance, while f32 (the control) is
// further away than that.
TEST_F(TrainDistributedTest, Bf16ProductsOnEveryRankAndReplica) {
  const std::string common =
      "train --model mlp --no-shuffle --batch 64 --optimizer sgd --lr 0.05 --quiet --train-limit 1024 "
      "--steps 5 --precision ";
  auto weights = [&](const std::string& name, const std::string& flags) {
    const RunResult run = runKolo(common + flags + " --save " + file(name + ".safetensors"));
    EXPECT_EQ(run.exitCode, 0) << name << ":\n" << run.output;
    return loadWeights(file(name + ".safetensors"));
  };
  const Weights one = weights("one", "bf16");
  ASSERT_EQ(one.size(), 6u);
  const Weights f32 = weights("f32", "f32");
  EXPECT_GT(relativeDifference(one[0].second, f32[0].second), 1e-4) << "bf16 and f32 gave the same weights";
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"workers2", "bf16 --workers 2"}, {"mirrored2", "bf16 --strategy mirrored --replicas 2"}}) {
    const Weights got = weights(name, flags);
    ASSERT_EQ(got.size(), one.size()) << name;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LE(relativeDifference(one[i].second, got[i].second), 1e-5) << name << " " << got[i].first;
  }
}

TEST_F(TrainDistributedTest, PaddedLastBatchIsTheSameOnTwoRanks) {
  // 100 samples, batch 64, --pad-last: every epoch is 2 steps, the second padded with the
  // epoch's first 28 samples; 2 ranks split both batches as one rank trains on them.
  const std::string common =
      "train --model mlp --no-shuffle --pad-last --train-limit 100 --batch 64 --optimizer sgd "
      "--lr 0.05 --quiet --steps 5 --metrics ";
  RunResult run = runKolo(common + file("one.jsonl") + " --save " + file("one.safetensors"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  run = runKolo(common + file("two.jsonl") + " --save " + file("two.safetensors") + " --workers 2");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const Weights a = loadWeights(file("one.safetensors"));
  const Weights b = loadWeights(file("two.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(relativeDifference(a[i].second, b[i].second), 1e-5) << a[i].first;
  // Epochs of 2 steps: 5 steps end in the third epoch.
  std::ifstream metrics(file("two.jsonl"));
  std::string line;
  nlohmann::json last;
  int lines = 0;
  while (std::getline(metrics, line)) {
    last = nlohmann::json::parse(line);
    lines += last.contains("kind") ? 0 : 1;  // event and interval lines aside
  }
  EXPECT_EQ(lines, 4);  // three epoch lines and the final line
  EXPECT_EQ(last["step"], 5);
  EXPECT_EQ(last["epoch"], 3);
}

TEST_F(TrainDistributedTest, CrashedRunResumesToTheUninterruptedWeights) {
  // 640 samples, batch 64: 10 steps per epoch; 16 steps cross an epoch boundary. The
  // default recipe's warm-up + cosine schedule and the shuffled order must both continue.
  const std::string common = "train --model mlp --train-limit 640 --batch 64 --steps 16 --quiet ";
  const RunResult straight = runKolo(common + "--save " + file("straight.safetensors"));
  ASSERT_EQ(straight.exitCode, 0) << straight.output;

  const std::string checkpoints = file("ckpt");
  const RunResult crashed = runKolo(common + "--checkpoint-dir " + checkpoints +
                                    " --checkpoint-every 3 --fail-at-step 13");
  ASSERT_NE(crashed.exitCode, 0) << crashed.output;
  EXPECT_NE(crashed.output.find("failure injected before step 13"), std::string::npos)
      << crashed.output;
  EXPECT_TRUE(fs::exists(checkpoints + "/ckpt-000000012"));

  const RunResult resumed = runKolo(common + "--resume " + checkpoints + " --metrics " +
                                    file("m.jsonl") + " --save " + file("resumed.safetensors"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("ckpt-000000012"), std::string::npos) << resumed.output;
  const Weights a = loadWeights(file("straight.safetensors"));
  const Weights b = loadWeights(file("resumed.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;

  // The metrics continue the step count: the resumed run's lines end at step 16.
  std::ifstream metrics(file("m.jsonl"));
  std::string line;
  nlohmann::json last;
  while (std::getline(metrics, line)) last = nlohmann::json::parse(line);
  EXPECT_EQ(last["step"], 16);
  EXPECT_EQ(last["final"], true);
}

TEST_F(TrainDistributedTest, WorkersResumeAndSkipACorruptCheckpoint) {
  // Two ranks: 7 steps with checkpoints at 3, 6 and 7, then the newest one is truncated;
  // the resumed run refuses it by name, continues from step 6 and matches 16 straight steps.
  const std::string common =
      "train --workers 2 --model mlp --train-limit 640 --batch 64 --optimizer sgd --lr 0.05 "
      "--quiet ";
  const RunResult straight = runKolo(common + "--steps 16 --save " + file("straight.safetensors"));
  ASSERT_EQ(straight.exitCode, 0) << straight.output;

  const std::string checkpoints = file("ckpt");
  const RunResult first =
      runKolo(common + "--steps 7 --checkpoint-every 3 --checkpoint-dir " + checkpoints);
  ASSERT_EQ(first.exitCode, 0) << first.output;
  const std::string newest = checkpoints + "/ckpt-000000007";
  ASSERT_TRUE(fs::exists(newest + "/model.safetensors")) << first.output;
  EXPECT_TRUE(fs::exists(checkpoints + "/ckpt-000000006"));
  fs::resize_file(newest + "/model.safetensors", fs::file_size(newest + "/model.safetensors") / 2);

  const RunResult resumed = runKolo(common + "--steps 16 --resume " + checkpoints + " --save " +
                                    file("resumed.safetensors"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(newest), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("ckpt-000000006"), std::string::npos) << resumed.output;
  const Weights a = loadWeights(file("straight.safetensors"));
  const Weights b = loadWeights(file("resumed.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
}

TEST_F(TrainDistributedTest, OneDeviceCheckpointResumesOnTwoRanks) {
  // The loader position counts global batches, so a run may resume on more ranks.
  const std::string common =
      "train --model mlp --train-limit 640 --batch 64 --optimizer sgd --lr 0.05 --quiet ";
  ASSERT_EQ(runKolo(common + "--steps 14 --save " + file("straight.safetensors")).exitCode, 0);
  const std::string checkpoints = file("ckpt");
  ASSERT_EQ(runKolo(common + "--steps 8 --checkpoint-dir " + checkpoints).exitCode, 0);
  const RunResult resumed = runKolo(common + "--workers 2 --steps 14 --resume " + checkpoints +
                                    " --save " + file("resumed.safetensors"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  const Weights a = loadWeights(file("straight.safetensors"));
  const Weights b = loadWeights(file("resumed.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(relativeDifference(a[i].second, b[i].second), 1e-5) << a[i].first;
  // Another batch changes the data order: refused by name.
  const RunResult other = runKolo(
      "train --model mlp --train-limit 640 --batch 32 --steps 14 --quiet --resume " + checkpoints);
  EXPECT_NE(other.exitCode, 0);
  EXPECT_NE(other.output.find("written with batch 64, this run has batch 32"), std::string::npos)
      << other.output;
}

TEST_F(TrainDistributedTest, ResumeWithoutAGoodCheckpointFails) {
  fs::create_directories(file("empty"));
  const RunResult run = runKolo("train --model mlp --steps 2 --quiet --resume " + file("empty"));
  EXPECT_NE(run.exitCode, 0);
  EXPECT_NE(run.output.find("no good checkpoint"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(file("empty")), std::string::npos) << run.output;
}

TEST_F(TrainDistributedTest, FailingRankUnderWorkersIsReported) {
  const RunResult run = runKolo(
      "train --workers 2 --model mlp --train-limit 640 --batch 64 --steps 6 --quiet "
      "--fail-at-step 2:1");
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1: failure injected before step 2"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("rank 1 (pid"), std::string::npos) << run.output;
}

TEST_F(TrainDistributedTest, BatchThatDoesNotSplitFailsClearly) {
  const RunResult run =
      runKolo("train --model mlp --steps 1 --batch 66 --strategy mirrored --replicas 4");
  EXPECT_NE(run.exitCode, 0);
  EXPECT_NE(run.output.find("--batch 66 does not split evenly over 4 replicas"), std::string::npos)
      << run.output;
}

}  // namespace
