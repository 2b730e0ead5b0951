// The Reducer's sharded optimizer update (ZeRO stage 1 over a shared window), ranks as
// threads over the native communicator: weights after several steps equal one device's
// full-batch training for SGD (momentum, Nesterov with weight decay) and Adam/AdamW with
// 2, 3 and 4 ranks; the consolidated optimizer state equals one device's; the bytes handed
// over are counted as the buckets' would be; a parameter
// without gradient is named; join() is refused.
#include <gtest/gtest.h>

#include <string>

#include "kolo/error.h"
#include "kolo/optim.h"
#include "native_ranks.h"
#include "toy_setup.h"

namespace kolo::parallel {
namespace {
using namespace testing;

constexpr int64_t kBatch = 24;
constexpr int kSteps = 4;

std::unique_ptr<optim::Optimizer> makeOptimizer(const std::string& kind, const NamedTensors& p) {
  if (kind == "sgd") return std::make_unique<optim::Sgd>(p, optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  if (kind == "nesterov")
    return std::make_unique<optim::Sgd>(
        p, optim::SgdOptions{.lr = 0.1, .momentum = 0.9, .weightDecay = 0.01, .nesterov = true});
  if (kind == "adam") return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 0.01});
  return optim::makeAdamW(p, optim::AdamOptions{.lr = 0.01});
}

// Every state tensor flattened, in (parameter, slot) order.
std::vector<double> flatState(const optim::StateDict& state) {
  std::vector<double> out;
  for (const auto& [name, tensor] : state.flatTensors()) {
    auto v = tensor.toDoubleVector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

struct Trained {
  std::vector<double> weights;
  std::vector<double> state;
};

Trained trainOneDevice(const std::string& kind, const ToyData& data) {
  NamedTensors p = makeToyParameters(100);
  auto optimizer = makeOptimizer(kind, p);
  for (int s = 0; s < kSteps; ++s) {
    optimizer->zeroGrad();
    toyLoss(p, data.x, data.y).backward();
    optimizer->step();
  }
  return {flatValues(p), flatState(optimizer->stateDict())};
}

class ShardedUpdate : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ShardedUpdate, MatchesOneDeviceAndConsolidatesTheState) {
  const auto [n, kind] = GetParam();
  const ToyData data = makeToyData(kBatch);
  const Trained expected = trainOneDevice(kind, data);
  auto connect = nativeRanks(n);
  std::vector<Trained> got(static_cast<size_t>(n));
  runThreads(n, [&](int r) {
    auto comm = connect(r);
    NamedTensors p = makeToyParameters(100 + r);  // the reducer broadcasts rank 0's
    ReducerOptions options;
    options.firstBucketCapBytes = 256;  // several buckets, parameters split across shards
    options.bucketCapBytes = 512;
    options.shardOptimizer = true;
    Reducer reducer(p, comm, options);
    EXPECT_TRUE(reducer.sharded());
    auto optimizer = makeOptimizer(kind, p);
    const int64_t lo = kBatch * r / n, hi = kBatch * (r + 1) / n;
    for (int s = 0; s < kSteps; ++s) {
      optimizer->zeroGrad();
      reducer.prepareForBackward();
      Tensor loss = toyLoss(p, data.rows(lo, hi, false), data.rows(lo, hi, true));
      reducer.setLocalLoss(loss.item());
      loss.backward();
      reducer.step(*optimizer);
      EXPECT_EQ(reducer.activeRanks(), n);
    }
    // Each step hands over the whole gradient and the 3 extra slots (active ranks, missing
    // gradients, loss), as the buckets would.
    int64_t elements = 0;
    for (const auto& entry : p) elements += entry.second.numel();
    EXPECT_EQ(reducer.bytesSent(), static_cast<uint64_t>(kSteps * (elements + 3) * 4));
    got[r].weights = flatValues(p);
    reducer.consolidateOptimizerState(*optimizer);
    got[r].state = flatState(optimizer->stateDict());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got[r].weights, got[0].weights) << "rank " << r << " has other weights";
    EXPECT_LT(maxRelDiff(got[r].weights, expected.weights), 1e-5) << "rank " << r;
    EXPECT_LT(maxRelDiff(got[r].state, expected.state), 1e-5) << "rank " << r << " state";
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndOptimizers, ShardedUpdate,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values("sgd", "nesterov", "adam", "adamw")),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

TEST(ShardedUpdateErrors, ParameterWithoutGradientIsNamedOnEveryRank) {
  const int n = 2;
  auto connect = nativeRanks(n, std::chrono::seconds(20));
  const ToyData data = makeToyData(8);
  std::vector<std::string> messages(n);
  runThreads(n, [&](int r) {
    auto comm = connect(r);
    NamedTensors p = makeToyParameters(5);
    Generator gen(9);
    p.emplace_back("head.extra", Tensor::rand({3}, gen).setRequiresGrad(true));
    ReducerOptions options;
    options.shardOptimizer = true;
    Reducer reducer(p, comm, options);
    optim::Sgd optimizer(p, {.lr = 0.1});
    Tensor loss = toyLoss(p, data.rows(4 * r, 4 * r + 4, false), data.rows(4 * r, 4 * r + 4, true));
    if (r == 0) loss = loss + sum(p[4].second);  // only rank 0 uses head.extra
    loss.backward();
    try {
      reducer.step(optimizer);
    } catch (const Error& e) {
      messages[r] = e.what();
    }
  });
  EXPECT_NE(messages[1].find("'head.extra'"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("missing on other rank"), std::string::npos) << messages[0];
}

TEST(ShardedUpdateErrors, JoinIsRefused) {
  const int n = 2;
  auto connect = nativeRanks(n, std::chrono::seconds(20));
  runThreads(n, [&](int r) {
    auto comm = connect(r);
    NamedTensors p = makeToyParameters(5);
    ReducerOptions options;
    options.shardOptimizer = true;
    Reducer reducer(p, comm, options);
    EXPECT_THROW(reducer.join(), InvalidArgument);
  });
}

}  // namespace
}  // namespace kolo::parallel
