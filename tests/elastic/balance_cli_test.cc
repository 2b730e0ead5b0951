// End-to-end tests of `kolo train --balance` (real processes under kolo run): without a
// slowdown the weights are plain data parallelism's; with a rank slowed 4x it is given a
// smaller share of each global batch, every sample is still trained on once per step, and
// the weights equal one device's fed the same global batches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kolo/safetensors.h"
#include "../cli/run_kolo.h"
#include "../cli/weights.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::RunResult;
using kolo::testing::relativeDifference;
using kolo::testing::runKolo;

class BalanceCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_balance_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string kolo() { return std::string(KOLO_BINARY_DIR) + "/src/cli/kolo"; }

  // Two ranks of multi-worker-mirrored with `options`, saving to `weights`.
  RunResult twoRanks(const std::string& options, const std::string& weights) const {
    // A deadline for a hang, not a speed limit: under ASan beside a second suite a rank has
    // taken more than 60 s to load the data set and reach the rendezvous.
    return runKolo("run -n 2 --timeout 300 -- " + kolo() + " " + kCommon +
                   " --strategy multi-worker-mirrored " + options + " --save " + file(weights));
  }
  void expectSameWeights(const std::string& expectedFile, const std::string& gotFile) const {
    const auto expected = kolo::checkpoint::loadSafetensors(file(expectedFile)).tensors;
    const auto got = kolo::checkpoint::loadSafetensors(file(gotFile)).tensors;
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first);
      EXPECT_LE(relativeDifference(expected[i].second.toFloatVector(), got[i].second.toFloatVector()),
                1e-5)
          << got[i].first;
    }
  }

  static inline const std::string kCommon =
      "train --model mlp --batch 12 --optimizer sgd --lr 0.05 --momentum 0.9 --quiet --seed 3 "
      "--train-limit 120 --steps 25";
  fs::path dir_;
};

TEST_F(BalanceCliTest, WithoutASlowdownTheWeightsArePlainDataParallels) {
  const RunResult plain = twoRanks("--overlap off", "plain.safetensors");
  ASSERT_EQ(plain.exitCode, 0) << plain.output;
  const RunResult balanced = twoRanks("--overlap off --balance --balance-every 3", "balanced.safetensors");
  ASSERT_EQ(balanced.exitCode, 0) << balanced.output;
  expectSameWeights("plain.safetensors", "balanced.safetensors");
}

// Rank 0 takes 4x its compute per step; re-planned every 2 steps with the Reducer's overlap.
TEST_F(BalanceCliTest, ASlowRankGetsASmallerShareAndTheWeightsAreOneDevices) {
  const RunResult one = runKolo(kCommon + " --save " + file("one.safetensors"));
  ASSERT_EQ(one.exitCode, 0) << one.output;
  const RunResult run = twoRanks("--overlap on --balance --balance-every 2 --debug-slow-rank 0:4 --metrics " +
                                     file("metrics.jsonl"),
                                 "balanced.safetensors");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  expectSameWeights("one.safetensors", "balanced.safetensors");
  // The split moved towards rank 1 (a 4x slowdown is far beyond the timing noise).
  std::ifstream metrics(file("metrics.jsonl"));
  int changes = 0;
  std::vector<int64_t> last;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.value("event", "") != "balance") continue;
    ++changes;
    last = record["shares"].get<std::vector<int64_t>>();
    EXPECT_EQ(last.size(), 2u);
    EXPECT_EQ(last[0] + last[1], 12);
  }
  ASSERT_GE(changes, 1) << run.output;
  EXPECT_LT(last[0], last[1]) << run.output;
}

TEST_F(BalanceCliTest, BalanceNeedsMultiWorkerMirrored) {
  const RunResult run = runKolo(kCommon + " --balance");
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("--balance applies to --strategy multi-worker-mirrored"),
            std::string::npos)
      << run.output;
}

}  // namespace
