// Multi-worker-mirrored over the native communicator, ranks as threads over an in-memory
// store: 10 SGD steps match one-device for N=2 and 4 with every all-reduce algorithm, and
// the first gradient bucket's all-reduce starts before backward ends.
#include <gtest/gtest.h>

#include "kolo/parallel/distributed.h"
#include "native_ranks.h"
#include "strategy_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

class NativeEquivalence : public OneDeviceReference<::testing::TestWithParam<std::tuple<int, comm::Algorithm>>> {};

TEST_P(NativeEquivalence, MultiWorkerMirroredMatchesOneDevice) {
  const auto [n, algorithm] = GetParam();
  ReducerOptions reducer;
  reducer.firstBucketCapBytes = 256 << 10;  // several buckets in flight per step
  reducer.bucketCapBytes = 1 << 20;
  auto w = trainMultiWorker(n, kSteps, nativeRanks(n), algorithm, reducer);
  EXPECT_LT(maxRelDiff(w, *reference_), 1e-5) << "N=" << n << " " << comm::algorithmName(algorithm);
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndAlgorithms, NativeEquivalence,
    ::testing::Combine(::testing::Values(2, 4),
                       ::testing::Values(comm::Algorithm::Auto, comm::Algorithm::Ring,
                                         comm::Algorithm::HalvingDoubling, comm::Algorithm::Tree,
                                         comm::Algorithm::ReduceBroadcast,
                                         comm::Algorithm::Hierarchical)),
    [](const auto& info) {
      std::string name = std::string("n") + std::to_string(std::get<0>(info.param)) + "_" +
                         comm::algorithmName(std::get<1>(info.param));
      for (char& c : name)
        if (c == '-') c = '_';
      return name;
    });

TEST(NativeReducer, FirstBucketStartsBeforeBackwardEnds) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const int n = 2;
  auto connect = nativeRanks(n);
  const TrainData& d = trainData();
  runThreads(n, [&](int rank) {
    auto comm = connect(rank);
    auto model = makeEquivalenceModel(rank);
    ReducerOptions options;
    options.firstBucketCapBytes = 16 << 10;
    options.bucketCapBytes = 128 << 10;
    Reducer reducer(model->namedParameters(), comm, options);
    ASSERT_GE(reducer.bucketCount(), 4u);
    for (int step = 0; step < 3; ++step) {
      model->zeroGrad();
      reducer.prepareForBackward();
      Tensor x = d.x.slice(0, 32 * rank, 32 * rank + 32).contiguous();
      Tensor y = d.y.slice(0, 32 * rank, 32 * rank + 32).contiguous();
      crossEntropy(model->forward(x), y).backward();
      const auto backwardReturned = Clock::now();
      reducer.finalize();
      const StepTimeline& t = reducer.timeline();
      EXPECT_LT(t.bucketStart[0], backwardReturned) << "rank " << rank << " step " << step;
      EXPECT_LT(t.bucketStart[0], t.lastHook);
      for (size_t b = 1; b < reducer.bucketCount(); ++b)
        EXPECT_LE(t.bucketStart[b - 1], t.bucketStart[b]);
    }
  });
}

TEST(NativeDistributed, BroadcastOptimizerStateAndDistributedOptimizer) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const int n = 2;
  auto connect = nativeRanks(n);
  const TrainData& d = trainData();
  std::vector<std::vector<double>> weights(n);
  runThreads(n, [&](int rank) {
    auto comm = connect(rank);
    auto model = makeEquivalenceModel(rank);
    DistributedOptimizer opt(equivalenceOptimizer(model->namedParameters()), comm);
    for (int step = 0; step < 2; ++step) {
      opt.zeroGrad();
      const int64_t lo = 64 * step + 32 * rank;
      Tensor x = d.x.slice(0, lo, lo + 32).contiguous();
      Tensor y = d.y.slice(0, lo, lo + 32).contiguous();
      crossEntropy(model->forward(x), y).backward();
      opt.step();
    }
    // A rank whose optimizer state was lost gets rank 0's back.
    auto fresh = equivalenceOptimizer(model->namedParameters());
    if (rank == 0) fresh = nullptr;
    optim::Optimizer& target = rank == 0 ? opt.optimizer() : *fresh;
    broadcastOptimizerState(target, *comm, 0);
    EXPECT_EQ(target.stepCount(), 2);
    if (rank == 1) {
      auto sd = target.stateDict().flatTensors();
      ASSERT_FALSE(sd.empty());
    }
    weights[rank] = modelValues(*model);
  });
  EXPECT_EQ(weights[0], weights[1]);
  // Two distributed steps of 2 x 32 equal two one-device steps of 64.
  StrategyOptions one;
  EXPECT_LT(maxRelDiff(weights[0], trainWithStrategy(one, 2)), 1e-5);
}

}  // namespace
}  // namespace kolo::parallel
