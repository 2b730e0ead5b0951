// Tests of the gradient Reducer with ranks as threads over the in-process replica group:
// averaged gradients equal the full batch's, buckets start during backward, noSync
// accumulation, a parameter without gradient is named, and join with uneven inputs.
#include <gtest/gtest.h>

#include <atomic>

#include "kolo/error.h"
#include "kolo/parallel/replica_group.h"
#include "toy_setup.h"

namespace kolo::parallel {
namespace {
using namespace testing;

std::vector<double> fullBatchGrads(const ToyData& data, int64_t lo, int64_t hi, uint64_t seed) {
  NamedTensors p = makeToyParameters(seed);
  toyLoss(p, data.rows(lo, hi, false), data.rows(lo, hi, true)).backward();
  return flatGrads(p);
}

class ReducerAverages : public ::testing::TestWithParam<std::tuple<int, LocalReduction>> {};

TEST_P(ReducerAverages, GradientsEqualTheFullBatch) {
  const auto [k, reduction] = GetParam();
  const int64_t batch = 24;
  ToyData data = makeToyData(batch);
  const auto expected = fullBatchGrads(data, 0, batch, 100);
  auto comms = makeReplicaGroup(k, reduction);
  std::vector<std::vector<double>> grads(k), values(k);
  std::vector<double> losses(k);
  runThreads(k, [&](int r) {
    NamedTensors p = makeToyParameters(100 + r);  // differs per rank: the broadcast fixes it
    ReducerOptions opts;
    opts.firstBucketCapBytes = 256;
    opts.bucketCapBytes = 512;
    Reducer reducer(p, comms[r], opts);
    values[r] = flatValues(p);
    const int64_t lo = batch * r / k, hi = batch * (r + 1) / k;
    reducer.prepareForBackward();
    Tensor loss = toyLoss(p, data.rows(lo, hi, false), data.rows(lo, hi, true));
    reducer.setLocalLoss(loss.item());
    loss.backward();
    reducer.finalize();
    grads[r] = flatGrads(p);
    losses[r] = reducer.globalLoss();
    EXPECT_EQ(reducer.activeRanks(), k);
  });
  EXPECT_EQ(values[k - 1], flatValues(makeToyParameters(100)));
  NamedTensors ref = makeToyParameters(100);
  const double fullLoss = toyLoss(ref, data.x, data.y).item();
  for (int r = 0; r < k; ++r) {
    EXPECT_EQ(grads[r], grads[0]) << "replica " << r << " differs";
    EXPECT_LT(maxRelDiff(grads[r], expected), 1e-5);
    EXPECT_NEAR(losses[r], fullLoss, 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReducerAverages,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(LocalReduction::ReduceToOne,
                                                              LocalReduction::HierarchicalCopy,
                                                              LocalReduction::Ring)));

TEST(Reducer, BucketsAreReverseOrderAndRespectTheCaps) {
  auto comms = makeReplicaGroup(1);
  NamedTensors p = makeToyParameters(1);
  ReducerOptions opts;
  opts.firstBucketCapBytes = 4 * kClasses * kHidden;  // exactly 2.weight
  opts.bucketCapBytes = 4 * kClasses * kHidden;
  Reducer reducer(p, comms[0], opts);
  // 2.bias and 2.weight together exceed the first cap; every later pair exceeds the cap.
  ASSERT_EQ(reducer.bucketCount(), 4u);
  EXPECT_EQ(reducer.bucketParameters(0), std::vector<size_t>{3});
  EXPECT_EQ(reducer.bucketParameters(1), std::vector<size_t>{2});
  EXPECT_EQ(reducer.bucketParameters(2), std::vector<size_t>{1});
  EXPECT_EQ(reducer.bucketParameters(3), std::vector<size_t>{0});
  Reducer one(p, comms[0], {});  // defaults: everything fits in the 1 MB first bucket
  EXPECT_EQ(one.bucketCount(), 1u);
  EXPECT_EQ(one.bucketBytes(0),
            static_cast<size_t>(4 * (kHidden * kIn + kHidden + kClasses * kHidden + kClasses)));
}

// A small model is split into ReducerOptions::minBuckets buckets by default, so that its
// all-reduces overlap backward: 208 KB of gradients make four buckets of 52 KB, not one.
TEST(Reducer, ASmallModelGetsSeveralBucketsByDefault) {
  auto comms = makeReplicaGroup(1);
  NamedTensors p;
  for (int k = 0; k < 4; ++k)
    p.emplace_back("w" + std::to_string(k), Tensor::zeros({13000}, DType::F32).setRequiresGrad());
  Reducer split(p, comms[0], {});
  ASSERT_EQ(split.bucketCount(), 4u);
  EXPECT_EQ(split.bucketBytes(0), 52000u);
  ReducerOptions whole;
  whole.minBuckets = 1;
  EXPECT_EQ(Reducer(p, comms[0], whole).bucketCount(), 1u);
}

TEST(Reducer, FirstBucketStartsBeforeBackwardEnds) {
  const int k = 2;
  auto comms = makeReplicaGroup(k);
  ToyData data = makeToyData(16);
  runThreads(k, [&](int r) {
    NamedTensors p = makeToyParameters(3);
    ReducerOptions opts;
    opts.firstBucketCapBytes = 1;  // one parameter per bucket
    opts.bucketCapBytes = 1;
    Reducer reducer(p, comms[r], opts);
    ASSERT_EQ(reducer.bucketCount(), 4u);
    reducer.prepareForBackward();
    Tensor loss = toyLoss(p, data.rows(8 * r, 8 * r + 8, false), data.rows(8 * r, 8 * r + 8, true));
    loss.backward();
    const auto backwardReturned = Clock::now();
    reducer.finalize();
    const StepTimeline& t = reducer.timeline();
    // The last layer's bucket was started from its hook, while the first layer's gradient
    // was still to be computed.
    EXPECT_LT(t.bucketStart[0], t.lastHook);
    EXPECT_LT(t.bucketStart[0], backwardReturned);
    EXPECT_LT(t.bucketStart[2], backwardReturned);
    EXPECT_LE(t.bucketStart[0], t.bucketStart[1]);
    for (size_t b = 0; b < 4; ++b) EXPECT_LE(t.bucketStart[b], t.bucketFinish[b]);
  });
}

TEST(Reducer, WithoutOverlapEveryBucketStartsInFinalize) {
  const int k = 2;
  auto comms = makeReplicaGroup(k);
  ToyData data = makeToyData(16);
  std::vector<std::vector<double>> grads(k);
  runThreads(k, [&](int r) {
    NamedTensors p = makeToyParameters(3);
    ReducerOptions opts;
    opts.firstBucketCapBytes = 1;
    opts.bucketCapBytes = 1;
    opts.overlap = false;
    Reducer reducer(p, comms[r], opts);
    toyLoss(p, data.rows(8 * r, 8 * r + 8, false), data.rows(8 * r, 8 * r + 8, true)).backward();
    reducer.finalize();
    const StepTimeline& t = reducer.timeline();
    for (size_t b = 0; b < reducer.bucketCount(); ++b) EXPECT_GE(t.bucketStart[b], t.finalizeStart);
    grads[r] = flatGrads(p);
  });
  EXPECT_LT(maxRelDiff(grads[0], fullBatchGrads(data, 0, 16, 3)), 1e-5);
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(Reducer, NoSyncAccumulationEqualsOneBigBatch) {
  const int k = 2;
  const int64_t micro = 6;
  ToyData data = makeToyData(4 * micro);
  auto comms = makeReplicaGroup(k);
  std::vector<std::vector<double>> grads(k);
  std::atomic<int> collectivesDuringNoSync{0};
  runThreads(k, [&](int r) {
    NamedTensors p = makeToyParameters(5);
    Reducer reducer(p, comms[r]);
    // Rank r's micro-batches: rows [2r*micro, (2r+1)*micro) and the next micro rows.
    const int64_t a = 2 * r * micro, b = a + micro, c = b + micro;
    {
      auto guard = reducer.noSync();
      toyLoss(p, data.rows(a, b, false), data.rows(a, b, true)).backward();
      reducer.finalize();  // a no-op inside noSync
      if (reducer.timeline().bucketStart[0] != Clock::time_point()) ++collectivesDuringNoSync;
    }
    toyLoss(p, data.rows(b, c, false), data.rows(b, c, true)).backward();
    reducer.finalize();
    grads[r] = flatGrads(p);
  });
  EXPECT_EQ(collectivesDuringNoSync.load(), 0);
  // Sum of two micro-batch means averaged over ranks = 2 x the mean over all 4 micro-batches.
  auto expected = fullBatchGrads(data, 0, 4 * micro, 5);
  for (double& v : expected) v *= 2;
  for (int r = 0; r < k; ++r) EXPECT_LT(maxRelDiff(grads[r], expected), 1e-5);
}

TEST(Reducer, ParameterWithoutGradientIsNamedOnEveryRank) {
  const int k = 2;
  auto comms = makeReplicaGroup(k, LocalReduction::Ring, std::chrono::seconds(10));
  ToyData data = makeToyData(8);
  std::vector<std::string> messages(k);
  runThreads(k, [&](int r) {
    NamedTensors p = makeToyParameters(5);
    Generator gen(9);
    p.emplace_back("head.extra", Tensor::rand({3}, gen).setRequiresGrad(true));
    Reducer reducer(p, comms[r]);
    Tensor loss = toyLoss(p, data.rows(4 * r, 4 * r + 4, false), data.rows(4 * r, 4 * r + 4, true));
    if (r == 0) loss = loss + sum(p[4].second);  // only rank 0 uses head.extra
    loss.backward();
    try {
      reducer.finalize();
    } catch (const Error& e) {
      messages[r] = e.what();
    }
    EXPECT_FALSE(messages[r].empty()) << "rank " << r << " did not throw";
  });
  EXPECT_NE(messages[1].find("'head.extra'"), std::string::npos) << messages[1];
  EXPECT_NE(messages[1].find("no gradient"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("missing on other rank"), std::string::npos) << messages[0];
}

TEST(Reducer, JoinWithUnevenInputsCompletes) {
  const int k = 3;
  auto comms = makeReplicaGroup(k, LocalReduction::Ring, std::chrono::seconds(20));
  ToyData data = makeToyData(64);
  const int stepsOf[k] = {2, 5, 3};
  std::vector<int64_t> shadowed(k);
  std::vector<std::vector<double>> finalValues(k);
  std::vector<std::vector<int>> actives(k);
  runThreads(k, [&](int r) {
    NamedTensors p = makeToyParameters(11);
    Reducer reducer(p, comms[r]);
    for (int s = 0; s < stepsOf[r]; ++s) {
      for (auto& [n, t] : p) t.zeroGrad();
      const int64_t lo = (s * k + r) * 4;
      toyLoss(p, data.rows(lo, lo + 4, false), data.rows(lo, lo + 4, true)).backward();
      reducer.finalize();
      actives[r].push_back(reducer.activeRanks());
      {
        autograd::NoGradGuard ng;
        for (auto& [n, t] : p) {
          float* w = t.data<float>();
          const float* g = t.grad().data<float>();
          for (int64_t i = 0; i < t.numel(); ++i) w[i] -= 0.1f * g[i];
        }
      }
    }
    shadowed[r] = reducer.join();
    finalValues[r] = flatValues(p);
  });
  EXPECT_EQ(shadowed[0], 3);
  EXPECT_EQ(shadowed[1], 0);
  EXPECT_EQ(shadowed[2], 2);
  EXPECT_EQ(actives[1], (std::vector<int>{3, 3, 2, 1, 1}));
  EXPECT_EQ(finalValues[0], finalValues[1]);
  EXPECT_EQ(finalValues[2], finalValues[1]);
}

}  // namespace
}  // namespace kolo::parallel
