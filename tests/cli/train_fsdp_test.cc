// End-to-end `kolo train --strategy fsdp` (real processes under kolo run): ZeRO-3 on 2 ranks
// and ZeRO-2 on 4 save the file one-device training saves (the same names and shapes, whole
// tensors, values within 1e-5) and report its test accuracy; that file starts a one-device
// run (--init); the options fsdp does not take are refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "run_kolo.h"
#include "support/fashion_mnist.h"
#include "weights.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::loadWeights;
using kolo::testing::relativeDifference;
using kolo::testing::RunResult;
using kolo::testing::runKolo;
using kolo::testing::Weights;

// The value after `key ` in the summary line.
double field(const std::string& output, const std::string& key) {
  const size_t at = output.find(key + " ");
  if (at == std::string::npos) return std::nan("");
  return std::stod(output.substr(at + key.size() + 1));
}

class TrainFsdpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_fsdp_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(TrainFsdpTest, SavesTheOneDeviceFile) {
  const std::string common =
      "train --model mlp --no-shuffle --batch 64 --optimizer adamw --threads 1 "
      "--train-limit 2048 --steps 10 --save ";
  const RunResult reference = runKolo(common + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;
  const Weights expected = loadWeights(file("one.safetensors"));
  ASSERT_EQ(expected.size(), 6u);
  const double accuracy = field(reference.output, "test_accuracy");

  for (const std::string& variant : {std::string("--workers 2 --strategy fsdp --shard full"),
                                     std::string("--workers 4 --strategy fsdp --shard grad")}) {
    const RunResult run = runKolo(common + file("fsdp.safetensors") + " " + variant);
    ASSERT_EQ(run.exitCode, 0) << variant << ":\n" << run.output;
    const Weights got = loadWeights(file("fsdp.safetensors"));
    ASSERT_EQ(got.size(), expected.size()) << variant;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first) << variant;
      ASSERT_EQ(got[i].second.size(), expected[i].second.size()) << variant << " " << got[i].first;
      EXPECT_LE(relativeDifference(expected[i].second, got[i].second), 1e-5)
          << variant << " " << got[i].first;
    }
    // Evaluation gathered the whole model: the same test accuracy as one device.
    EXPECT_NEAR(field(run.output, "test_accuracy"), accuracy, 1e-3) << run.output;
    EXPECT_NE(run.output.find("tensor memory"), std::string::npos) << run.output;
  }
  // The fsdp file starts one-device training.
  const RunResult init = runKolo("train --model mlp --train-limit 256 --steps 1 --threads 1 --init " +
                                 file("fsdp.safetensors"));
  EXPECT_EQ(init.exitCode, 0) << init.output;
  EXPECT_NE(init.output.find("loaded initial weights"), std::string::npos) << init.output;
}

TEST_F(TrainFsdpTest, RefusesWhatFsdpDoesNotTake) {
  const RunResult resume =
      runKolo("train --model mlp --strategy fsdp --steps 1 --resume " + file("none"));
  EXPECT_NE(resume.exitCode, 0);
  EXPECT_NE(resume.output.find("not available with --strategy fsdp"), std::string::npos)
      << resume.output;
  const RunResult shard = runKolo("train --model mlp --strategy fsdp --shard zero3 --steps 1");
  EXPECT_NE(shard.exitCode, 0);
  EXPECT_NE(shard.output.find("--shard"), std::string::npos) << shard.output;
}

}  // namespace
