// Balancer: the even split it starts from, the split proportional to speed (sums, granules,
// rounding), the hysteresis, a re-plan agreed over ranks as threads, and the math: a
// multi-worker-mirrored step over an uneven split with weighted losses gives the weights
// of one device fed the whole global batch.
#include "kolo/parallel/balancer.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "kolo/nn/nn.h"
#include "kolo/optim.h"
#include "kolo/parallel/strategy.h"
#include "../parallel/native_ranks.h"

namespace kolo::parallel {
namespace {

void onThreads(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(Balancer, StartsWithTheEvenSplit) {
  Balancer even(12, 1, 4);
  EXPECT_EQ(even.shares(), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(even.offset(), 3);
  EXPECT_EQ(even.lossWeight(), 1.0);
  // 10 over 4: the first two ranks take one more.
  Balancer uneven(10, 3, 4);
  EXPECT_EQ(uneven.shares(), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(uneven.offset(2), 6);
  EXPECT_EQ(uneven.offset(), 8);
  EXPECT_DOUBLE_EQ(uneven.lossWeight(), 2.0 * 4 / 10);
  EXPECT_THROW(Balancer(3, 0, 4), InvalidArgument);
  EXPECT_THROW(Balancer(12, 0, 2, {.granularity = 5}), InvalidArgument);
}

TEST(Balancer, SharesFollowSpeedInWholeGranules) {
  EXPECT_EQ(Balancer::proportionalShares(12, {1.0, 3.0}), (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(Balancer::proportionalShares(12, {2.0, 1.0, 1.0}), (std::vector<int64_t>{6, 3, 3}));
  // 10 · (1, 1, 1) / 3: one remainder, to the lowest rank.
  EXPECT_EQ(Balancer::proportionalShares(10, {1.0, 1.0, 1.0}), (std::vector<int64_t>{4, 3, 3}));
  // Granules of 4: 16 · (1, 3) / 4 is 1 and 3 granules.
  EXPECT_EQ(Balancer::proportionalShares(16, {1.0, 3.0}, 4), (std::vector<int64_t>{4, 12}));
  // A very slow rank still takes one granule; the sum stays the batch.
  const std::vector<int64_t> shares = Balancer::proportionalShares(8, {1e-6, 1.0, 1.0, 1.0});
  EXPECT_EQ(shares, (std::vector<int64_t>{1, 3, 2, 2}));
  EXPECT_THROW(Balancer::proportionalShares(8, {1.0, 0.0}), InvalidArgument);
  EXPECT_DOUBLE_EQ(Balancer::predictedStepSeconds({3, 9}, {0.3, 0.1}), 0.9);
}

// Rank r reports `windows[w][r]` seconds per sample for `steps` steps (plus, in the first
// window, the first step, left out), then every rank re-plans over a native communicator of
// ranks as threads, once per window.
std::vector<Balancer> replanned(int64_t batch, const std::vector<std::vector<double>>& windows,
                                int64_t steps, std::vector<bool>* changed = nullptr) {
  const int n = static_cast<int>(windows.front().size());
  auto ranks = testing::nativeRanks(n);
  std::vector<Balancer> balancers;
  for (int r = 0; r < n; ++r) balancers.emplace_back(batch, r, n, BalancerOptions{.replanEvery = steps});
  // One byte per rank: the ranks' threads write their results at once, and std::vector<bool>
  // packs them into shared words, where one thread's write can undo another's.
  std::vector<char> results(static_cast<size_t>(n));
  onThreads(n, [&](int r) {
    auto comm = ranks(r);
    Balancer& b = balancers[static_cast<size_t>(r)];
    for (size_t w = 0; w < windows.size(); ++w) {
      for (int64_t s = w == 0 ? 0 : 1; s <= steps; ++s) {
        EXPECT_FALSE(b.replanDue());
        b.record(static_cast<double>(b.share()) * windows[w][static_cast<size_t>(r)]);
      }
      EXPECT_TRUE(b.replanDue());
      results[static_cast<size_t>(r)] = b.replan(*comm);
      EXPECT_FALSE(b.replanDue());
    }
  });
  if (changed) changed->assign(results.begin(), results.end());
  return balancers;
}

TEST(Balancer, ARankThreeTimesSlowerTakesAThirdOfTheOthersShare) {
  std::vector<bool> changed;
  const std::vector<Balancer> balancers = replanned(12, {{0.003, 0.001}}, 3, &changed);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(changed[static_cast<size_t>(r)]);
    EXPECT_EQ(balancers[static_cast<size_t>(r)].shares(), (std::vector<int64_t>{3, 9}));
    EXPECT_DOUBLE_EQ(balancers[static_cast<size_t>(r)].secondsPerSample()[0], 0.003);
  }
  EXPECT_DOUBLE_EQ(balancers[0].lossWeight(), 0.5);
  EXPECT_DOUBLE_EQ(balancers[1].lossWeight(), 1.5);
  EXPECT_EQ(balancers[1].offset(), 3);
}

// The estimate is the mean of the window and the previous estimate: rank 0 measured 5x,
// then 1x rank 1's time per sample, is taken as 3x (shares 3 and 9 of 12).
TEST(Balancer, OneWindowMovesTheEstimateHalfway) {
  const std::vector<Balancer> balancers = replanned(12, {{0.005, 0.001}, {0.001, 0.001}}, 2);
  EXPECT_DOUBLE_EQ(balancers[1].secondsPerSample()[0], 0.003);
  EXPECT_DOUBLE_EQ(balancers[1].secondsPerSample()[1], 0.001);
  EXPECT_EQ(balancers[1].shares(), (std::vector<int64_t>{3, 9}));
}

TEST(Balancer, SmallDifferencesLeaveTheSplitAlone) {
  // 10% apart: the proportional split of 40 is 19 and 21, predicted 4.5% faster than 20
  // and 20, within the 5% hysteresis.
  EXPECT_EQ(Balancer::proportionalShares(40, {1 / 0.0011, 1 / 0.001}), (std::vector<int64_t>{19, 21}));
  std::vector<bool> changed;
  const std::vector<Balancer> balancers = replanned(40, {{0.0011, 0.001}}, 2, &changed);
  EXPECT_FALSE(changed[0]);
  EXPECT_FALSE(changed[1]);
  EXPECT_EQ(balancers[0].shares(), (std::vector<int64_t>{20, 20}));
}

// The math: 2 ranks take 3 and 9 of a global batch of 12 with weighted losses; the weights
// after two SGD steps with momentum equal one device's fed the 12 samples, to float tolerance.
TEST(Balancer, WeightedUnevenSharesGiveTheUpdateOfOneDevice) {
  constexpr int64_t kBatch = 12;
  Generator data(11);
  const Tensor inputs = Tensor::randn({kBatch, 6}, data);
  std::vector<int64_t> labelValues;
  for (int64_t i = 0; i < kBatch; ++i) labelValues.push_back(i % 4);
  const Tensor labels = Tensor::fromVector({kBatch}, labelValues);
  auto models = [] {
    Generator g(5);
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<nn::Linear>(6, 8, g));
    model->add(std::make_shared<nn::ReLU>());
    model->add(std::make_shared<nn::Linear>(8, 4, g));
    return std::shared_ptr<nn::Module>(model);
  };
  auto optimizers = [](const NamedTensors& p) {
    return std::make_unique<optim::Sgd>(p, optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  };
  auto one = makeStrategy({}, models, optimizers);
  for (int step = 0; step < 2; ++step) one->trainStep(inputs, labels);

  std::vector<Balancer> balancers = replanned(kBatch, {{0.003, 0.001}}, 1);
  ASSERT_EQ(balancers[0].shares(), (std::vector<int64_t>{3, 9}));
  auto ranks = testing::nativeRanks(2);
  std::vector<NamedTensors> weights(2);
  onThreads(2, [&](int r) {
    const Balancer& b = balancers[static_cast<size_t>(r)];
    StrategyOptions options;
    options.kind = StrategyKind::MultiWorkerMirrored;
    options.communicator = ranks(r);
    auto strategy = makeStrategy(options, models, optimizers, b.weightedLoss());
    for (int step = 0; step < 2; ++step)
      strategy->trainStep(inputs.slice(0, b.offset(), b.offset() + b.share()).contiguous(),
                          labels.slice(0, b.offset(), b.offset() + b.share()).contiguous());
    weights[static_cast<size_t>(r)] = strategy->model().namedParameters();
  });
  const NamedTensors expected = one->model().namedParameters();
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < expected.size(); ++i) {
      const std::vector<float> want = expected[i].second.toFloatVector();
      const std::vector<float> got = weights[static_cast<size_t>(r)][i].second.toFloatVector();
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_NEAR(got[k], want[k], 1e-5 * (1.0 + std::abs(want[k]))) << expected[i].first << " rank " << r;
    }
}

}  // namespace
}  // namespace kolo::parallel
