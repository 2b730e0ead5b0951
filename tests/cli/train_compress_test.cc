// End-to-end tests of `kolo train --compress` (real processes): a PowerSGD run interrupted
// and resumed from its checkpoint (each rank's residuals and Q matrices travel through rank
// 0's checkpoint) ends with the uninterrupted run's weights; bad specs fail by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "kolo/safetensors.h"
#include "run_kolo.h"
#include "weights.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;
using kolo::testing::runKolo;
using kolo::testing::RunResult;

class TrainCompressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_compress_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

using kolo::testing::loadWeights;
using kolo::testing::Weights;

TEST_F(TrainCompressTest, PowerSgdResumedRunEndsWithTheUninterruptedWeights) {
  // PowerSGD starts compressing at step 10: the checkpoint at step 12 holds residuals and Q.
  const std::string common =
      "train --workers 2 --model mlp --train-limit 640 --batch 64 --optimizer sgd --lr 0.05 "
      "--quiet --compress powersgd:2 ";
  const RunResult straight = runKolo(common + "--steps 16 --save " + file("straight.safetensors"));
  ASSERT_EQ(straight.exitCode, 0) << straight.output;

  const std::string checkpoints = file("ckpt");
  const RunResult first = runKolo(common + "--steps 12 --checkpoint-dir " + checkpoints);
  ASSERT_EQ(first.exitCode, 0) << first.output;
  ASSERT_TRUE(fs::exists(checkpoints + "/ckpt-000000012/extra.safetensors")) << first.output;
  const auto state =
      kolo::checkpoint::loadSafetensors(checkpoints + "/ckpt-000000012/extra.safetensors");
  EXPECT_TRUE(state.find("compress.rank0.powersgd.step").defined());
  const kolo::Tensor residual = state.find("compress.rank1.powersgd.bucket0.residual");
  ASSERT_TRUE(residual.defined());
  double residualNorm = 0.0;
  for (double v : residual.toDoubleVector()) residualNorm += std::abs(v);
  EXPECT_GT(residualNorm, 0.0) << "PowerSGD left nothing out: it did not compress";

  const RunResult resumed = runKolo(common + "--steps 16 --resume " + checkpoints + " --save " +
                                    file("resumed.safetensors"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  const auto a = loadWeights(file("straight.safetensors"));
  const auto b = loadWeights(file("resumed.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;

  // Resuming the compressed checkpoint without --compress is refused.
  const RunResult mismatch = runKolo(
      "train --workers 2 --model mlp --train-limit 640 --batch 64 --optimizer sgd --lr 0.05 "
      "--quiet --steps 16 --resume " +
      checkpoints);
  EXPECT_NE(mismatch.exitCode, 0);
  EXPECT_NE(mismatch.output.find("--compress) but this run's commHook is none"), std::string::npos) << mismatch.output;
}

TEST_F(TrainCompressTest, BadSpecsFailByName) {
  for (const std::string spec : {"powersgd:0", "topk:2"}) {
    const RunResult run = runKolo(
        "train --model mlp --steps 1 --quiet --strategy "
        "multi-worker-mirrored --compress " +
        spec);
    EXPECT_NE(run.exitCode, 0) << spec;
    EXPECT_NE(run.output.find("--compress " + spec), std::string::npos) << run.output;
  }
  const RunResult oneDevice = runKolo("train --model mlp --steps 1 --quiet --compress fp16");
  EXPECT_NE(oneDevice.exitCode, 0);
  EXPECT_NE(oneDevice.output.find("--compress applies to --strategy multi-worker-mirrored, not to --strategy one-device"), std::string::npos)
      << oneDevice.output;
}

}  // namespace
