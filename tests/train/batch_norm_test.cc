// Batch norm under the data-parallel strategies, through fit on ranks as threads: with
// synchronised batch norm, two replicas of multi-worker-mirrored, fsdp, mirrored and
// central-storage take one device's steps on the global batch, running statistics included
// (and without it, as the control, they do not); evaluation runs in eval mode; a checkpoint
// of two synchronised ranks resumes on one device.
#include <gtest/gtest.h>

#include <filesystem>

#include "kolo/nn/nn.h"
#include "kolo/train/fit.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

using parallel::StrategyKind;
using parallel::testing::nativeRanks;
using parallel::testing::runThreads;
using testing::maxAbsDiff;
using testing::weights;

constexpr int64_t kFeatures = 12;
constexpr int64_t kClasses = 3;

// Each sample's 12 features as a (1, 3, 4) image: a convolution, a batch norm, and a head.
std::shared_ptr<nn::Module> model() {
  Generator gen(4);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Unflatten>(1, Shape{1, 3, 4}));
  net->add(std::make_shared<nn::Conv2d>(1, 4, 3, gen, 1, 1, /*bias=*/false));
  net->add(std::make_shared<nn::BatchNorm2d>(4));
  net->add(std::make_shared<nn::ReLU>());
  net->add(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  net->add(std::make_shared<nn::Flatten>());
  net->add(std::make_shared<nn::Linear>(4, kClasses, gen));
  return net;
}

std::unique_ptr<optim::Optimizer> sgd(const parallel::NamedTensors& parameters) {
  return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.2, .momentum = 0.9});
}

// Trains 6 steps of batch 24 with `kind` (two replicas: ranks as threads or replica threads)
// and returns the model's state on rank 0, running statistics included.
std::vector<float> trainWith(StrategyKind kind, bool sync, const std::string& resumeDir = "",
                             const std::string& checkpointDir = "") {
  const auto train = testing::argmaxDataset(144, kFeatures, kClasses);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  std::vector<float> result;
  auto run = [&](std::shared_ptr<comm::Communicator> comm) {
    DataParallelOptions options;
    options.strategy.kind = kind;
    options.strategy.replicas = 2;
    options.strategy.communicator = std::move(comm);
    options.strategy.syncBatchNorm = sync;
    DataParallelEngine engine(model, sgd, options);
    FitOptions fit;
    fit.batch = 24;
    fit.steps = 6;
    fit.shuffle = false;
    fit.quiet = true;
    fit.prefetch = 0;
    fit.logger = &logger;
    fit.resumeDir = resumeDir;
    fit.checkpointDir = checkpointDir;
    train::fit(engine, train, nullptr, fit);
    engine.gatherModel();
    if (engine.isPrimary()) result = weights(engine.model());
  };
  if (kind == StrategyKind::MultiWorkerMirrored || kind == StrategyKind::FullyShardedDataParallel) {
    auto make = nativeRanks(2);
    runThreads(2, [&](int rank) { run(make(rank)); });
  } else {
    run(nullptr);
  }
  return result;
}

TEST(BatchNormTest, SynchronisedReplicasTakeOneDevicesStepsOnTheGlobalBatch) {
  const std::vector<float> initial = weights(*model());
  const std::vector<float> one = trainWith(StrategyKind::OneDevice, false);
  EXPECT_GT(maxAbsDiff(one, initial), 1e-2) << "training did not move the weights";
  for (StrategyKind kind : {StrategyKind::MultiWorkerMirrored, StrategyKind::FullyShardedDataParallel,
                            StrategyKind::Mirrored, StrategyKind::CentralStorage}) {
    SCOPED_TRACE(parallel::strategyKindName(kind));
    EXPECT_LT(maxAbsDiff(trainWith(kind, true), one), 2e-5);
  }
  // The control: each replica normalising with its own half takes other steps.
  EXPECT_GT(maxAbsDiff(trainWith(StrategyKind::MultiWorkerMirrored, false), one), 1e-3);
}

TEST(BatchNormTest, TwoSynchronisedRanksResumeOnOneDevice) {
  const std::string dir = testing::freshDir("kolo_batch_norm_test", "resume");
  const std::vector<float> two = trainWith(StrategyKind::MultiWorkerMirrored, true, "", dir);
  // Resumed at its last step: nothing left to train, the state is the checkpoint's.
  const std::vector<float> one = trainWith(StrategyKind::OneDevice, false, dir);
  EXPECT_EQ(one, two);
  std::filesystem::remove_all(dir);
}

TEST(BatchNormTest, EvaluationNormalisesWithTheRunningStatistics) {
  const auto data = testing::argmaxDataset(48, kFeatures, kClasses);
  auto net = model();
  net->forward(data->inputs());  // a batch in training mode moves the running statistics
  const std::vector<float> before = weights(*net);
  const EvaluateResult result = evaluate(*net, *data, {.batch = 7, .loss = nullptr, .communicator = nullptr});
  EXPECT_EQ(weights(*net), before) << "evaluation moved the running statistics";
  net->train(false);
  const Tensor logits = net->forward(data->inputs());
  const double expected = crossEntropy(logits, data->labels()).item();
  EXPECT_NEAR(result.loss, expected, 1e-5 * expected);
}

}  // namespace
}  // namespace kolo::train
