// Activation checkpointing through the train layer: a DataParallelEngine with recompute on
// ends with the weights of the same run without it, on one device, on two ranks of
// multi-worker-mirrored and of fsdp (ZeRO-3, whose units gather their weights again for the
// recomputation), and refuses a model that is not an nn::Sequential by name.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/train/fit.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

using parallel::StrategyKind;
using parallel::testing::nativeRanks;
using parallel::testing::runThreads;

// Residual-free blocks wide enough that recomputation matters: LayerNorm, Linear, GELU.
std::shared_ptr<nn::Module> model() {
  Generator gen(3);
  auto net = std::make_shared<nn::Sequential>();
  for (int b = 0; b < 3; ++b) {
    auto block = std::make_shared<nn::Sequential>();
    block->add(std::make_shared<nn::LayerNorm>(Shape{16}));
    block->add(std::make_shared<nn::Linear>(16, 64, gen));
    block->add(std::make_shared<nn::GELU>());
    block->add(std::make_shared<nn::Linear>(64, 16, gen));
    net->add(block);
  }
  net->add(std::make_shared<nn::Linear>(16, 4, gen));
  return net;
}

std::unique_ptr<optim::Optimizer> adamw(const parallel::NamedTensors& parameters) {
  return std::make_unique<optim::Adam>(parameters, optim::AdamOptions{.lr = 1e-2, .weightDecay = 0.01, .decoupled = true});
}

// Rank 0's weights after 8 steps of `kind` on `ranks` thread ranks (0: one device).
std::vector<float> train(StrategyKind kind, int ranks, bool recompute) {
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  std::vector<float> weights;
  auto run = [&](std::shared_ptr<comm::Communicator> comm) {
    DataParallelOptions options;
    options.strategy.kind = kind;
    options.strategy.communicator = std::move(comm);
    options.recompute = recompute;
    DataParallelEngine engine(model, adamw, options);
    FitOptions fitOptions;
    fitOptions.batch = 32;
    fitOptions.steps = 8;
    fitOptions.quiet = true;
    fitOptions.prefetch = 0;
    fitOptions.logger = &logger;
    fit(engine, testing::argmaxDataset(256, 16, 4), nullptr, fitOptions);
    engine.gatherModel();
    if (engine.isPrimary())
      for (const auto& [name, tensor] : engine.model().stateDict()) {
        const std::vector<float> values = tensor.toFloatVector();
        weights.insert(weights.end(), values.begin(), values.end());
      }
  };
  if (ranks == 0) {
    run(nullptr);
  } else {
    auto make = nativeRanks(ranks);
    runThreads(ranks, [&](int rank) { run(make(rank)); });
  }
  return weights;
}

TEST(RecomputeTest, EveryStrategyEndsWithTheWeightsOfTheRunWithoutIt) {
  for (const auto& [kind, ranks] : std::vector<std::pair<StrategyKind, int>>{
           {StrategyKind::OneDevice, 0},
           {StrategyKind::MultiWorkerMirrored, 2},
           {StrategyKind::FullyShardedDataParallel, 2}}) {
    const std::vector<float> plain = train(kind, ranks, false), recomputed = train(kind, ranks, true);
    ASSERT_EQ(plain.size(), recomputed.size());
    for (size_t i = 0; i < plain.size(); ++i)
      ASSERT_EQ(plain[i], recomputed[i]) << parallel::strategyKindName(kind) << " weight " << i;
  }
}

TEST(RecomputeTest, AModelThatIsNotASequentialIsRefused) {
  DataParallelOptions options;
  options.recompute = true;
  const auto linear = [] {
    Generator gen(1);
    return std::make_shared<nn::Linear>(4, 2, gen);
  };
  try {
    DataParallelEngine engine(linear, adamw, options);
    FAIL() << "a Linear was taken for recompute";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("recompute needs the model to be an nn::Sequential"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kolo::train
