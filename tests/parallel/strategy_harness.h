// Shared set-up of the strategy equivalence tests: the first 640 Fashion-MNIST training
// samples, the `mlp` with a seeded init, SGD(lr 0.05, momentum 0.9), and training loops
// for one-device, any in-process strategy, and multi-worker-mirrored with ranks as threads.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "kolo/data.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/strategy.h"
#include "support/fashion_mnist.h"
#include "toy_setup.h"

namespace kolo::parallel::testing {

inline constexpr int kSteps = 10;
inline constexpr int64_t kGlobalBatch = 64;

struct TrainData {
  Tensor x;  // f32 [640, 784]
  Tensor y;  // i64 [640]
};

/// Tests that reach this start with KOLO_SKIP_WITHOUT_FASHION_MNIST().
inline const TrainData& trainData() {
  static const TrainData data = [] {
    const data::FashionMnist first(data::kFashionMnistDir, true, kSteps * kGlobalBatch);
    return TrainData{first.inputs(), first.labels()};
  }();
  return data;
}

inline std::shared_ptr<nn::Module> makeEquivalenceModel(uint64_t seed) {
  Generator gen(1000 + seed);
  return nn::makeModel("mlp", gen);
}

inline std::unique_ptr<optim::Optimizer> equivalenceOptimizer(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
}

inline std::vector<double> modelValues(nn::Module& m) { return flatValues(m.namedParameters()); }

/// Trains `steps` global batches in file order with an in-process strategy; the first model
/// the factory builds has seed 0 (the others differ: the strategy must make them agree).
inline std::vector<double> trainWithStrategy(const StrategyOptions& options, int steps) {
  auto counter = std::make_shared<std::atomic<uint64_t>>(0);
  auto strategy = makeStrategy(
      options, [counter] { return makeEquivalenceModel((*counter)++); }, equivalenceOptimizer);
  const TrainData& d = trainData();
  for (int s = 0; s < steps; ++s) {
    strategy->trainStep(d.x.slice(0, s * kGlobalBatch, (s + 1) * kGlobalBatch).contiguous(),
                        d.y.slice(0, s * kGlobalBatch, (s + 1) * kGlobalBatch).contiguous());
  }
  return modelValues(strategy->model());
}

inline std::vector<double> trainOneDevice(int steps) {
  StrategyOptions options;
  options.kind = StrategyKind::OneDevice;
  return trainWithStrategy(options, steps);
}

/// `steps` steps of `strategy` on this rank's DistributedSampler slices of the first
/// epoch in file order (global batch kGlobalBatch); `afterStep` runs after each.
inline void trainOnSampledSlices(Strategy& strategy, const data::TensorDataset& dataset, int steps,
                                 const std::function<void()>& afterStep = {}) {
  data::DistributedSampler sampler(dataset.size(), {.globalBatch = kGlobalBatch,
                                                    .rank = strategy.dataRank(),
                                                    .worldSize = strategy.dataWorldSize(),
                                                    .shuffle = false});
  const std::vector<int64_t> order = sampler.indices(0);
  const int64_t local = sampler.localBatch();
  for (int s = 0; s < steps; ++s) {
    std::vector<int64_t> idx(order.begin() + s * local, order.begin() + (s + 1) * local);
    data::Batch b = dataset.gather(idx);
    strategy.trainStep(b.inputs, b.labels);
    if (afterStep) afterStep();
  }
}

/// Multi-worker-mirrored with `n` ranks as threads; commFor(rank) is called on the rank's
/// own thread (native communicators connect there). Every rank reads its DistributedSampler
/// slice. Returns rank 0's weights after checking every rank holds the same ones.
inline std::vector<double> trainMultiWorker(
    int n, int steps, const std::function<std::shared_ptr<comm::Communicator>(int)>& commFor,
    comm::Algorithm algorithm, ReducerOptions reducer = {}) {
  const TrainData& d = trainData();
  data::TensorDataset dataset(d.x, d.y);
  std::vector<std::vector<double>> weights(n);
  runThreads(n, [&](int rank) {
    StrategyOptions options;
    options.kind = StrategyKind::MultiWorkerMirrored;
    options.communicator = commFor(rank);
    options.reducer = reducer;
    options.reducer.collective.algorithm = algorithm;
    auto strategy = makeStrategy(
        options, [rank] { return makeEquivalenceModel(rank); }, equivalenceOptimizer);
    trainOnSampledSlices(*strategy, dataset, steps);
    weights[rank] = modelValues(strategy->model());
  });
  for (int r = 1; r < n; ++r)
    if (weights[r] != weights[0])
      ADD_FAILURE() << "rank " << r << " holds other weights than rank 0";
  return weights[0];
}

/// A test fixture (over ::testing::Test or a TestWithParam) whose suite trains the
/// one-device reference once, when the dataset is there; each test skips without it.
template <class Base>
class OneDeviceReference : public Base {
 protected:
  static void SetUpTestSuite() {
    if (kolo::testing::fashionMnistInstalled()) reference_ = new std::vector<double>(trainOneDevice(kSteps));
  }
  void SetUp() override { KOLO_SKIP_WITHOUT_FASHION_MNIST(); }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  static inline std::vector<double>* reference_ = nullptr;
};

}  // namespace kolo::parallel::testing
