// End-to-end tests of `kolo train`: a short run writes metrics and weights; a wrong-shape
// --init file, a missing dataset and an unknown strategy each fail with a clear message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "kolo/data.h"
#include "kolo/safetensors.h"
#include "run_kolo.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::RunResult;
using kolo::testing::runKolo;

class TrainCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(TrainCliTest, ShortRunWritesMetricsAndWeights) {
  const RunResult run = runKolo(
      "train --model mlp --steps 20 --batch 64 --optimizer sgd --lr 0.05 --no-progress"
      " --metrics " +
      file("m.jsonl") + " --save " + file("w.safetensors"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("test_accuracy"), std::string::npos) << run.output;

  std::ifstream metrics(file("m.jsonl"));
  std::string line;
  int lines = 0;
  nlohmann::json last;
  while (std::getline(metrics, line)) {
    last = nlohmann::json::parse(line);
    if (last.contains("kind")) continue;  // event and interval lines
    for (const char* key :
         {"epoch", "step", "train_loss", "test_accuracy", "samples_per_s", "wall_s"}) {
      EXPECT_TRUE(last.contains(key)) << key << " missing in " << line;
    }
    ++lines;
  }
  EXPECT_GE(lines, 2);  // the epoch line and the final line
  EXPECT_EQ(last["step"], 20);
  // 20 SGD steps already lift the mlp well above chance (0.1).
  EXPECT_GT(last["test_accuracy"].get<double>(), 0.3);
  EXPECT_TRUE(std::isfinite(last["train_loss"].get<double>()));

  const kolo::checkpoint::SafetensorsFile weights =
      kolo::checkpoint::loadSafetensors(file("w.safetensors"));
  ASSERT_EQ(weights.tensors.size(), 6u);
  EXPECT_EQ(weights.tensors[0].first, "0.weight");
  EXPECT_EQ(weights.tensors[0].second.shape(), (kolo::Shape{512, 784}));
  EXPECT_EQ(weights.tensors[5].first, "4.bias");
  EXPECT_EQ(weights.metadata.at("step"), "20");
}

TEST_F(TrainCliTest, InitFromSavedWeightsIsDeterministic) {
  // Two runs from the same --init in file order end with identical weights.
  ASSERT_EQ(
      runKolo("train --model mlp --steps 1 --quiet --save " + file("init.safetensors")).exitCode,
      0);
  for (const char* name : {"a.safetensors", "b.safetensors"}) {
    const RunResult run =
        runKolo("train --model mlp --steps 5 --quiet --no-shuffle --seed 9 --init " +
                file("init.safetensors") + " --save " + file(name));
    ASSERT_EQ(run.exitCode, 0) << run.output;
  }
  const auto a = kolo::checkpoint::loadSafetensors(file("a.safetensors"));
  const auto b = kolo::checkpoint::loadSafetensors(file("b.safetensors"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].second.toFloatVector(), b.tensors[i].second.toFloatVector())
        << a.tensors[i].first;
  }
}

TEST_F(TrainCliTest, WrongShapeInitFailsClearly) {
  kolo::Generator gen(0);
  kolo::checkpoint::saveSafetensors(file("bad.safetensors"),
                                    {{"0.weight", kolo::Tensor::randn({256, 784}, gen)},
                                     {"0.bias", kolo::Tensor::zeros({256})},
                                     {"2.weight", kolo::Tensor::zeros({256, 512})},
                                     {"2.bias", kolo::Tensor::zeros({256})},
                                     {"4.weight", kolo::Tensor::zeros({10, 256})},
                                     {"4.bias", kolo::Tensor::zeros({10})}});
  const RunResult run =
      runKolo("train --model mlp --steps 1 --quiet --init " + file("bad.safetensors"));
  EXPECT_NE(run.exitCode, 0);
  EXPECT_NE(run.output.find("0.weight: file has [256, 784], model expects [512, 784]"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("bad.safetensors"), std::string::npos) << run.output;
}

TEST_F(TrainCliTest, MissingDatasetFailsClearly) {
  const RunResult run = runKolo("train --model mlp --steps 1 --data " + file("no_such_dir"));
  EXPECT_NE(run.exitCode, 0);
  EXPECT_NE(run.output.find(file("no_such_dir")), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("dataset-fashion-mnist"), std::string::npos) << run.output;
}

TEST_F(TrainCliTest, UnknownStrategyAndBadFlagsFail) {
  RunResult run = runKolo("train --model mlp --steps 1 --strategy parameter-server");
  EXPECT_NE(run.exitCode, 0);
  EXPECT_NE(run.output.find("parameter-server"), std::string::npos) << run.output;
  run = runKolo("train --model vgg");
  EXPECT_NE(run.exitCode, 0);
  EXPECT_NE(run.output.find("vgg"), std::string::npos) << run.output;
}

// The table of flags by strategy that --help prints names only flags kolo train has, and
// every strategy it names refuses what the table does not give it.
TEST(TrainFlagTable, NamesRealFlagsAndRefusesTheOthersByName) {
  const RunResult help = runKolo("train --help");
  ASSERT_EQ(help.exitCode, 0) << help.output;
  const size_t table = help.output.find("Flags that only some strategies accept");
  ASSERT_NE(table, std::string::npos) << help.output;
  const std::string options = help.output.substr(0, table), scopes = help.output.substr(table);
  std::set<std::string> listed;  // every "--name" in the table
  for (size_t at = scopes.find("--"); at != std::string::npos; at = scopes.find("--", at + 2)) {
    size_t end = at + 2;
    while (end < scopes.size() && (std::islower(static_cast<unsigned char>(scopes[end])) ||
                                   std::isdigit(static_cast<unsigned char>(scopes[end])) || scopes[end] == '-'))
      ++end;
    const std::string name = scopes.substr(at, end - at);
    if (name != "--strategy" && name != "--model") listed.insert(name);
  }
  EXPECT_GE(listed.size(), 40u) << scopes;
  for (const std::string& name : listed)
    EXPECT_NE(options.find(name + " "), std::string::npos) << name << " is not an option";
  const RunResult ps = runKolo("train --model mlp --steps 1 --ps-mode async --quiet");
  EXPECT_EQ(ps.exitCode, 2) << ps.output;
  EXPECT_NE(ps.output.find("--ps-mode applies to --strategy parameter-server, not to --strategy "
                           "one-device"),
            std::string::npos)
      << ps.output;
  const RunResult lm = runKolo("train --model mlp --steps 1 --d-model 64 --quiet");
  EXPECT_NE(lm.output.find("--d-model applies to --model lm"), std::string::npos) << lm.output;
}

}  // namespace
