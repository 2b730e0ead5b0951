// The command line only maps flags: `kolo train` and a program that builds the same engine
// and fit options through the public headers end with the same weights (bit for bit on one
// device; to float rounding when the command line runs 2 ranks of multi-worker-mirrored).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kolo/nn/models.h"
#include "kolo/safetensors.h"
#include "kolo/threads.h"
#include "kolo/train/fit.h"
#include "run_kolo.h"
#include "support/fashion_mnist.h"
#include "weights.h"

namespace kolo {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFlags =
    "--model mlp --optimizer sgd --lr 0.05 --steps 8 --batch 64 --train-limit 640 --seed 3 "
    "--prefetch off --quiet";

// What those flags mean, written against the library: the mlp seeded by --seed, SGD with the
// recipe's momentum 0.9 at a constant rate, 8 steps of 64 over the first 640 samples.
testing::Weights libraryWeights() {
  setNumThreads(1);  // --threads' default
  auto train = std::make_shared<data::FashionMnist>(data::kFashionMnistDir, true, 640);
  train::DataParallelEngine engine(
      [] {
        Generator gen(3);
        return nn::makeModel("mlp", gen);
      },
      [](const parallel::NamedTensors& parameters) {
        return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
      },
      train::DataParallelOptions{});
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  train::FitOptions options;
  options.steps = 8;
  options.batch = 64;
  options.seed = 3;
  options.prefetch = 0;
  options.quiet = true;
  options.logger = &logger;
  train::fit(engine, train, nullptr, options);
  testing::Weights weights;
  for (const auto& [name, tensor] : engine.model().stateDict()) weights.emplace_back(name, tensor.toFloatVector());
  std::sort(weights.begin(), weights.end());
  return weights;
}

TEST(CliLibraryTest, TheCommandLineAndTheLibraryGiveTheSameWeights) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const fs::path dir = fs::temp_directory_path() / ("kolo_cli_library_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string one = (dir / "one.safetensors").string(), two = (dir / "two.safetensors").string();
  const auto run1 = testing::runKolo("train " + std::string(kFlags) + " --save " + one);
  ASSERT_EQ(run1.exitCode, 0) << run1.output;
  const auto run2 = testing::runKolo("train --workers 2 " + std::string(kFlags) + " --save " + two);
  ASSERT_EQ(run2.exitCode, 0) << run2.output;
  const testing::Weights library = libraryWeights(), cli = testing::loadWeights(one),
                         cli2 = testing::loadWeights(two);
  ASSERT_EQ(library.size(), cli.size());
  ASSERT_EQ(library.size(), cli2.size());
  for (size_t t = 0; t < library.size(); ++t) {
    ASSERT_EQ(library[t].first, cli[t].first);
    EXPECT_EQ(library[t].second, cli[t].second) << library[t].first << ": one device differs";
    EXPECT_LT(testing::relativeDifference(library[t].second, cli2[t].second), 1e-5) << library[t].first;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kolo
