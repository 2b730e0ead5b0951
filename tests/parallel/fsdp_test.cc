// Fully sharded data parallelism over the native communicator, ranks as threads: ZeRO-2 and
// ZeRO-3 reach the weights of plain data parallelism (multi-worker-mirrored) and of
// one-device training at the same global batch after 10 steps, with SGD + momentum and
// AdamW, at 2 and 4 ranks (the mlp's last layer has 2570 parameters, so 4 ranks shard it
// unevenly); ZeRO-3 holds no whole parameters between steps, and gathers none for a unit
// whose backward does not read them; accumulated micro-batches take one device's steps; bad
// configurations are refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/parallel/fsdp.h"
#include "native_ranks.h"
#include "strategy_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

enum class Opt { SgdMomentum, AdamW };

OptimizerFactory optimizerFor(Opt opt) {
  return [opt](const NamedTensors& params) -> std::unique_ptr<optim::Optimizer> {
    if (opt == Opt::SgdMomentum)
      return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
    return optim::makeAdamW(params,
                            optim::AdamOptions{.lr = 1e-3, .weightDecay = 0.01, .decoupled = true});
  };
}

// One device, global batch kGlobalBatch in file order.
std::vector<double> oneDevice(Opt opt) {
  StrategyOptions options;
  auto strategy = makeStrategy(options, [] { return makeEquivalenceModel(0); }, optimizerFor(opt));
  const TrainData& d = trainData();
  for (int s = 0; s < kSteps; ++s) {
    strategy->trainStep(d.x.slice(0, s * kGlobalBatch, (s + 1) * kGlobalBatch).contiguous(),
                        d.y.slice(0, s * kGlobalBatch, (s + 1) * kGlobalBatch).contiguous());
  }
  return modelValues(strategy->model());
}

// `kind` (fsdp or multi-worker-mirrored) with n ranks as threads (rank r's model has another
// init: the broadcast must make them agree); rank 0's whole weights after checking every
// rank gathers the same ones.
// `unitMinParameters` and `inspect` (called on each rank's strategy before training) are
// fsdp's.
std::vector<double> trainRanks(StrategyKind kind, int n, ShardLevel level, Opt opt,
                               bool prefetch = true, int64_t unitMinParameters = 0,
                               const std::function<void(Strategy&, int rank)>& inspect = {},
                               int accumulate = 1, int shardGroup = 0) {
  const TrainData& d = trainData();
  data::TensorDataset dataset(d.x, d.y);
  auto connect = nativeRanks(n);
  std::vector<std::vector<double>> weights(n);
  runThreads(n, [&](int rank) {
    StrategyOptions options;
    options.kind = kind;
    options.communicator = connect(rank);
    options.shard = level;
    auto model = [rank] { return makeEquivalenceModel(rank); };
    auto strategy = kind == StrategyKind::FullyShardedDataParallel
                        ? makeFsdpStrategy(options.communicator,
                                           {.shard = level,
                                            .collective = {},
                                            .prefetch = prefetch,
                                            .shardGroup = shardGroup,
                                            .unitMinParameters = unitMinParameters},
                                           model, optimizerFor(opt))
                        : makeStrategy(options, model, optimizerFor(opt));
    strategy->setAccumulate(accumulate);
    if (inspect) inspect(*strategy, rank);
    trainOnSampledSlices(*strategy, dataset, kSteps, [&] {
      if (kind == StrategyKind::FullyShardedDataParallel && level == ShardLevel::Full) {
        // Between steps ZeRO-3 keeps no whole parameter.
        for (auto& [name, p] : strategy->model().namedParameters())
          EXPECT_EQ(p.impl()->storage->bytes, nullptr) << name << " on rank " << rank;
      }
    });
    strategy->gatherModel();
    weights[rank] = modelValues(strategy->model());
  });
  for (int r = 1; r < n; ++r)
    if (weights[r] != weights[0]) ADD_FAILURE() << "rank " << r << " holds other weights than rank 0";
  return weights[0];
}

class FsdpEquivalence : public ::testing::TestWithParam<Opt> {
 protected:
  void SetUp() override { KOLO_SKIP_WITHOUT_FASHION_MNIST(); }
};

// ZeRO-2 and ZeRO-3 at 2 and 4 ranks against plain data parallelism at the same rank count
// and against one device.
TEST_P(FsdpEquivalence, MatchesDataParallelismAfterTenSteps) {
  const Opt opt = GetParam();
  const std::vector<double> oneDeviceWeights = oneDevice(opt);
  // The updates moved the weights far more than the tolerances: the checks can fail.
  EXPECT_GT(maxRelDiff(oneDeviceWeights, modelValues(*makeEquivalenceModel(0))), 1e-2);
  for (int n : {2, 4}) {
    const std::vector<double> dp =
        trainRanks(StrategyKind::MultiWorkerMirrored, n, ShardLevel::Full, opt);
    for (ShardLevel level : {ShardLevel::Gradients, ShardLevel::Full}) {
      const std::vector<double> w = trainRanks(StrategyKind::FullyShardedDataParallel, n, level, opt);
      const std::string what = std::string(shardLevelName(level)) + " on " + std::to_string(n) + " ranks";
      ASSERT_EQ(w.size(), dp.size()) << what;
      // Reduce-scatter and all-reduce sum the ranks' gradients in different orders. SGD
      // carries that rounding through linearly; Adam divides by the gradient's running
      // magnitude, which amplifies it where a gradient nearly cancels (1.3e-5 at 4 ranks on an
      // AVX-512 machine), so Adam gets a tenfold looser bound, still far below the 1e-2 the
      // updates moved the weights.
      EXPECT_LT(maxRelDiff(w, dp), opt == Opt::SgdMomentum ? 1e-5 : 1e-4) << what << " vs data parallelism";
      // One device sums the batch's gradients in another order. SGD's update is linear in
      // the gradient, so that moves the weights by rounding only; Adam divides by the
      // gradient's magnitude, so where a gradient nearly cancels its sign follows the
      // rounding, and plain data parallelism itself differs from one device by about 2e-4.
      EXPECT_LT(maxRelDiff(w, oneDeviceWeights), opt == Opt::SgdMomentum ? 1e-5 : 1e-3)
          << what << " vs one device";
      // Prefetching the next unit's gather changes when it runs, not what it computes.
      if (level == ShardLevel::Full && n == 4) {
        EXPECT_EQ(w, trainRanks(StrategyKind::FullyShardedDataParallel, n, level, opt, false))
            << what << ": with and without prefetch";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FsdpEquivalence,
                         ::testing::Values(Opt::SgdMomentum, Opt::AdamW),
                         [](const auto& info) {
                           return std::string(info.param == Opt::SgdMomentum ? "SgdMomentum" : "AdamW");
                         });

// Units of several layers (FsdpOptions::unitMinParameters): the mlp's Linears (children 0, 2
// and 4) hold 401,920, 131,328 and 2,570 parameters, so a minimum of 500,000 makes units
// {0, 2} and {4}, and 10^9 one unit of the whole model. Whether the first Linear's parameters
// are still gathered when the second and the last Linear's forwards start shows the units
// (ZeRO-3 frees a unit after the forward of its last layer); the weights after 10 steps are
// those of data parallelism.
TEST(Fsdp, UnitsOfSeveralLayersAreGatheredTogetherAndGiveTheSameWeights) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const int n = 2;
  const std::vector<double> dp =
      trainRanks(StrategyKind::MultiWorkerMirrored, n, ShardLevel::Full, Opt::AdamW);
  struct Case {
    int64_t minimum;
    bool gatheredAtSecond;  // the first Linear's parameters, at the second Linear's forward
    bool gatheredAtLast;    // at the last Linear's forward
  };
  for (const Case& c : {Case{0, false, false}, Case{500'000, true, false},
                        Case{1'000'000'000, true, true}}) {
    for (ShardLevel level : {ShardLevel::Gradients, ShardLevel::Full}) {
      const std::string what = std::string(shardLevelName(level)) + ", units of at least " +
                               std::to_string(c.minimum) + " parameters";
      std::vector<int> atSecond(n, -1), atLast(n, -1);
      const std::vector<double> w = trainRanks(
          StrategyKind::FullyShardedDataParallel, n, level, Opt::AdamW, true, c.minimum,
          [&](Strategy& strategy, int rank) {
            const auto& children = strategy.model().children();
            ASSERT_EQ(children.size(), 5u);
            Tensor first = children[0].second->namedParameters().front().second;
            auto watch = [first](int& seen) {
              return [&seen, first](nn::Module&) { seen = first.impl()->storage->bytes ? 1 : 0; };
            };
            children[2].second->addForwardPreHook(watch(atSecond[rank]));
            children[4].second->addForwardPreHook(watch(atLast[rank]));
          });
      EXPECT_LT(maxRelDiff(w, dp), 1e-5) << what;
      // ZeRO-2 keeps every parameter gathered.
      const bool zero2 = level == ShardLevel::Gradients;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(atSecond[r], zero2 || c.gatheredAtSecond ? 1 : 0) << what << ", rank " << r;
        EXPECT_EQ(atLast[r], zero2 || c.gatheredAtLast ? 1 : 0) << what << ", rank " << r;
      }
    }
  }
}

// ZeRO-3 gathers a unit for backward only where backward reads its parameters: the mlp's first
// Linear is fed by the data, needs no input gradient and keeps no reference to its weight, so
// its parameters stay sharded through backward (its gradient is written into a buffer of its
// own). A unit of the first two Linears is gathered: the second one's backward reads its
// weight. Seen from output-gradient hooks registered after fsdp's (so they run after its
// gather); the weights after 10 steps are those of data parallelism.
TEST(Fsdp, AUnitThatBackwardDoesNotReadIsNotGatheredForIt) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const int n = 2;
  const std::vector<double> dp =
      trainRanks(StrategyKind::MultiWorkerMirrored, n, ShardLevel::Full, Opt::AdamW);
  struct Case {
    int64_t minimum;
    int firstGathered;   // the first Linear's parameters, as backward reaches that Linear
    int secondGathered;  // the second Linear's, as backward reaches it
  };
  for (const Case& c : {Case{0, 0, 1}, Case{500'000, 1, 1}}) {
    const std::string what = "units of at least " + std::to_string(c.minimum) + " parameters";
    // Per rank: the lowest and highest value each hook saw over the steps (1: gathered).
    std::vector<std::pair<int, int>> first(n, {2, -1}), second(n, {2, -1});
    const std::vector<double> w = trainRanks(
        StrategyKind::FullyShardedDataParallel, n, ShardLevel::Full, Opt::AdamW, true, c.minimum,
        [&](Strategy& strategy, int rank) {
          const auto& children = strategy.model().children();
          ASSERT_EQ(children.size(), 5u);
          auto watch = [](nn::Module& layer, std::pair<int, int>& seen) {
            Tensor weight = layer.namedParameters().front().second;
            layer.addOutputGradHook([weight, &seen](nn::Module&, const Tensor&) {
              const int gathered = weight.impl()->storage->bytes ? 1 : 0;
              seen = {std::min(seen.first, gathered), std::max(seen.second, gathered)};
            });
          };
          watch(*children[0].second, first[rank]);
          watch(*children[2].second, second[rank]);
        });
    EXPECT_LT(maxRelDiff(w, dp), 1e-5) << what;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(first[r], std::make_pair(c.firstGathered, c.firstGathered)) << what << ", rank " << r;
      EXPECT_EQ(second[r], std::make_pair(c.secondGathered, c.secondGathered)) << what << ", rank " << r;
    }
  }
}

// A model that calls its children's forward() directly skips the hooks that operator() runs,
// fsdp's gathers among them: under ZeRO-3 its layers would read parameters whose memory was
// released. That is an error naming the cause, not a crash; with ZeRO-2 (parameters kept
// whole) the same model trains.
TEST(Fsdp, AModelThatSkipsItsChildrensHooksIsToldWhy) {
  class DirectCalls : public nn::Module {
   public:
    DirectCalls() {
      Generator gen(1);
      first_ = registerModule("first", std::make_shared<nn::Linear>(6, 8, gen));
      second_ = registerModule("second", std::make_shared<nn::Linear>(8, 3, gen));
    }
    Tensor forward(const Tensor& x) override { return second_->forward(relu(first_->forward(x))); }

   private:
    std::shared_ptr<nn::Linear> first_, second_;
  };
  Generator gen(2);
  const Tensor x = Tensor::randn({4, 6}, gen);
  const Tensor y = Tensor::fromVector({4}, std::vector<int64_t>{0, 1, 2, 0});
  for (const ShardLevel level : {ShardLevel::Full, ShardLevel::Gradients}) {
    auto connect = nativeRanks(2);
    runThreads(2, [&](int rank) {
      auto strategy = makeFsdpStrategy(connect(rank), {.shard = level},
                                       [] { return std::make_shared<DirectCalls>(); },
                                       optimizerFor(Opt::SgdMomentum));
      if (level == ShardLevel::Gradients) {
        for (int s = 0; s < 2; ++s) EXPECT_TRUE(std::isfinite(strategy->trainStep(x, y).loss));
        return;
      }
      try {
        for (int s = 0; s < 2; ++s) strategy->trainStep(x, y);
        ADD_FAILURE() << "rank " << rank << ": ZeRO-3 read released parameters without an error";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("call its children as (*child)(x)"), std::string::npos)
            << e.what();
      }
    });
  }
}

// Gradient accumulation: each rank's 32 rows a step as 2 or 4 micro-batches, every
// micro-batch's gradients reduce-scattered and added in the shard, give the steps of one
// device on the whole batch of 64 (the mlp has no batch norm), under ZeRO-2, ZeRO-3 and HSDP
// (4 ranks in shard groups of 2, whose shards are then all-reduced across the groups).
TEST(Fsdp, AccumulatedMicroBatchesTakeOneDevicesSteps) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<double> reference = oneDevice(Opt::SgdMomentum);
  EXPECT_GT(maxRelDiff(reference, modelValues(*makeEquivalenceModel(0))), 1e-2);  // it trained
  struct Case {
    int ranks;
    ShardLevel level;
    int accumulate, shardGroup;
  };
  for (const Case& c : {Case{2, ShardLevel::Gradients, 2, 0}, Case{2, ShardLevel::Full, 4, 0},
                        Case{4, ShardLevel::Full, 2, 2}}) {
    const std::string what = std::string(shardLevelName(c.level)) + " on " + std::to_string(c.ranks) +
                             " ranks, accumulate " + std::to_string(c.accumulate) + ", shard group " +
                             std::to_string(c.shardGroup);
    const std::vector<double> w = trainRanks(StrategyKind::FullyShardedDataParallel, c.ranks, c.level,
                                             Opt::SgdMomentum, true, 0, {}, c.accumulate, c.shardGroup);
    // As in MatchesDataParallelismAfterTenSteps: SGD carries the sums' other order linearly.
    EXPECT_LT(maxRelDiff(w, reference), 1e-5) << what;
  }
  // Not vacuous: the loss sees the micro-batches (one rank, 32 rows, accumulate 4).
  std::vector<int64_t> rows;
  auto connect = nativeRanks(1);
  auto strategy = makeFsdpStrategy(
      connect(0), {}, [] { return makeEquivalenceModel(0); }, optimizerFor(Opt::SgdMomentum),
      [&rows](nn::Module& model, const Tensor& x, const Tensor& y) {
        rows.push_back(x.size(0));
        return crossEntropy(model.forward(x), y);
      });
  strategy->setAccumulate(4);
  const TrainData& d = trainData();
  strategy->trainStep(d.x.slice(0, 0, 32).contiguous(), d.y.slice(0, 0, 32).contiguous());
  EXPECT_EQ(rows, (std::vector<int64_t>{8, 8, 8, 8}));
  // 32 rows a rank do not split into 3 micro-batches.
  EXPECT_THROW(trainRanks(StrategyKind::FullyShardedDataParallel, 2, ShardLevel::Full,
                          Opt::SgdMomentum, true, 0, {}, 3),
               InvalidArgument);
}

TEST(Fsdp, RefusesBadConfigurations) {
  EXPECT_THROW(parseShardLevel("zero3"), InvalidArgument);
  EXPECT_EQ(parseShardLevel("grad"), ShardLevel::Gradients);
  StrategyOptions options;
  options.kind = StrategyKind::FullyShardedDataParallel;
  EXPECT_THROW(makeStrategy(options, [] { return makeEquivalenceModel(0); }, optimizerFor(Opt::AdamW)),
               InvalidArgument);
  // Parameters on the root module cannot be assigned to a unit.
  auto connect = nativeRanks(1);
  options.communicator = connect(0);
  class RootParameter : public nn::Module {
   public:
    RootParameter() { registerParameter("w", Tensor::zeros({3})); }
    Tensor forward(const Tensor& x) override { return x; }
  };
  try {
    makeStrategy(options, [] { return std::make_shared<RootParameter>(); }, optimizerFor(Opt::AdamW));
    ADD_FAILURE() << "a root parameter was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("root module"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolo::parallel
