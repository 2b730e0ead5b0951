// Resume through a checkpoint with a strategy and a shuffling DataLoader: 6 steps straight
// equal 3 steps, a checkpoint, a fresh process-like restart (other init) restored from it,
// and 3 more steps — bit-identical weights, for one-device and mirrored (K=2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "kolo/checkpoint.h"
#include "kolo/data.h"
#include "kolo/parallel/strategy.h"
#include "strategy_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;
namespace fs = std::filesystem;

struct ResumableRun {
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<data::DataLoader> loader;
};

ResumableRun startRun(StrategyKind kind, uint64_t initSeed) {
  StrategyOptions options;
  options.kind = kind;
  options.replicas = 2;
  ResumableRun run;
  run.strategy = makeStrategy(
      options, [initSeed] { return makeEquivalenceModel(initSeed); }, equivalenceOptimizer);
  const TrainData& d = trainData();
  auto dataset = std::make_shared<data::TensorDataset>(d.x, d.y);
  auto sampler = std::make_shared<data::DistributedSampler>(
      dataset->size(),
      data::DistributedSamplerOptions{.globalBatch = kGlobalBatch, .shuffle = true, .seed = 5});
  run.loader = std::make_unique<data::DataLoader>(
      dataset, sampler, data::DataLoaderOptions{.batchSize = kGlobalBatch});
  return run;
}

void trainSteps(ResumableRun& run, int steps) {
  data::Batch batch;
  for (int s = 0; s < steps; ++s) {
    if (!run.loader->next(batch)) {
      ASSERT_TRUE(run.loader->next(batch));
    }
    run.strategy->trainStep(batch.inputs, batch.labels);
  }
}

class Resume : public ::testing::TestWithParam<StrategyKind> {};

TEST_P(Resume, CheckpointedRunContinuesBitIdentically) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const fs::path dir =
      fs::temp_directory_path() / ("kolo_resume_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ResumableRun straight = startRun(GetParam(), 0);
  trainSteps(straight, 12);  // crosses the epoch boundary (10 batches per epoch)

  ResumableRun first = startRun(GetParam(), 0);
  trainSteps(first, 7);
  checkpoint::CheckpointManager manager(dir.string(), 2, first.strategy->isPrimary());
  checkpoint::TrainingState state;
  state.step = 7;
  state.loader = first.loader->state();
  manager.save(first.strategy->model().namedParameters(), &first.strategy->optimizer(), state);
  first = ResumableRun();

  ResumableRun resumed =
      startRun(GetParam(), 99);  // another init: everything must come from the checkpoint
  auto restored = manager.restoreLatest(resumed.strategy->model().namedParameters(),
                                        &resumed.strategy->optimizer());
  ASSERT_TRUE(restored.has_value());
  resumed.strategy->syncReplicas();
  resumed.loader->setState(restored->loader);
  trainSteps(resumed, 12 - static_cast<int>(restored->step));

  EXPECT_EQ(modelValues(resumed.strategy->model()), modelValues(straight.strategy->model()));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Strategies, Resume,
                         ::testing::Values(StrategyKind::OneDevice, StrategyKind::Mirrored),
                         [](const auto& info) {
                           return info.param == StrategyKind::OneDevice ? "one_device" : "mirrored";
                         });

}  // namespace
}  // namespace kolo::parallel
