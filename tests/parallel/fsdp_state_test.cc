// Fully sharded data parallelism beyond one step, ranks as threads over the native
// communicator: checkpoints hold whole tensors (the optimizer state equals plain data
// parallelism's) and resume exactly on the rank count that wrote them and within rounding on
// another, on one device, or from one device; --clip-norm over the shards clips as one device
// does; HSDP (shard groups replicated across) gives plain data parallelism's weights.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include <string>

#include "kolo/autograd.h"
#include "kolo/ops.h"
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

// What a checkpoint holds: whole weights and whole optimizer state.
struct Saved {
  NamedTensors weights;
  optim::StateDict optimizer;
};

// Builds rank `rank`'s strategy over its communicator (null on one device).
using Build = std::function<std::unique_ptr<Strategy>(std::shared_ptr<comm::Communicator>, int rank)>;

Build fsdp(Opt opt, FsdpOptions options) {
  return [opt, options](std::shared_ptr<comm::Communicator> comm, int rank) {
    return makeFsdpStrategy(std::move(comm), options, [rank] { return makeEquivalenceModel(rank); },
                            optimizerFor(opt));
  };
}

Build plain(Opt opt, StrategyKind kind) {
  return [opt, kind](std::shared_ptr<comm::Communicator> comm, int rank) {
    StrategyOptions options;
    options.kind = kind;
    options.communicator = std::move(comm);
    return makeStrategy(options, [rank] { return makeEquivalenceModel(rank); }, optimizerFor(opt));
  };
}

// Steps [first, first + steps) of the first epoch in file order on n ranks (threads), each on
// its DistributedSampler slices; optionally loaded from `from` first (rank 0 reads, as the
// trainer does) and saved into `to` at the end. Returns rank 0's whole weights, after checking
// every rank gathers the same.
std::vector<double> train(int n, const Build& build, int first, int steps, const Saved* from = nullptr,
                          Saved* to = nullptr) {
  const TrainData& d = trainData();
  data::TensorDataset dataset(d.x, d.y);
  auto connect = nativeRanks(n);
  std::vector<std::vector<double>> weights(n);
  runThreads(n, [&](int rank) {
    auto strategy = build(n > 1 ? connect(rank) : nullptr, rank);
    if (from) {
      strategy->gatherModel();
      if (rank == 0) {
        strategy->model().loadStateDict(from->weights);
        strategy->checkpointOptimizer().loadStateDict(from->optimizer);
      }
      strategy->syncReplicas();
    }
    data::DistributedSampler sampler(dataset.size(), {.globalBatch = kGlobalBatch,
                                                      .rank = strategy->dataRank(),
                                                      .worldSize = strategy->dataWorldSize(),
                                                      .shuffle = false});
    const std::vector<int64_t> order = sampler.indices(0);
    const int64_t local = sampler.localBatch();
    for (int s = first; s < first + steps; ++s) {
      data::Batch b = dataset.gather({order.begin() + s * local, order.begin() + (s + 1) * local});
      strategy->trainStep(b.inputs, b.labels);
    }
    if (to) {
      strategy->consolidateState();
      if (rank == 0) {
        to->weights.clear();
        for (const auto& [name, t] : strategy->model().stateDict()) to->weights.emplace_back(name, t.clone());
        to->optimizer = strategy->checkpointOptimizer().stateDict();
      }
    }
    strategy->gatherModel();
    weights[rank] = modelValues(strategy->model());
  });
  for (int r = 1; r < n; ++r)
    if (weights[r] != weights[0]) ADD_FAILURE() << "rank " << r << " holds other weights than rank 0";
  return weights[0];
}

std::vector<double> stateValues(const optim::StateDict& state) {
  std::vector<double> values;
  for (const auto& [name, t] : state.flatTensors()) {
    const std::vector<double> v = t.toDoubleVector();
    values.insert(values.end(), v.begin(), v.end());
  }
  return values;
}

class FsdpCheckpoint : public ::testing::TestWithParam<Opt> {
 protected:
  void SetUp() override { KOLO_SKIP_WITHOUT_FASHION_MNIST(); }
};

TEST_P(FsdpCheckpoint, ResumesExactlyOnTheSameRanksAndWithinRoundingOnOthers) {
  const Opt opt = GetParam();
  const FsdpOptions full{.shard = ShardLevel::Full};
  const std::vector<double> straight = train(2, fsdp(opt, full), 0, kSteps);

  // The checkpoint after 5 steps holds what plain data parallelism holds: the same names,
  // shapes and values (the whole optimizer state, assembled from the shards).
  Saved sharded, dp;
  train(2, fsdp(opt, full), 0, 5, nullptr, &sharded);
  train(2, plain(opt, StrategyKind::MultiWorkerMirrored), 0, 5, nullptr, &dp);
  ASSERT_EQ(sharded.weights.size(), dp.weights.size());
  ASSERT_EQ(sharded.optimizer.flatTensors().size(), dp.optimizer.flatTensors().size());
  for (size_t i = 0; i < dp.optimizer.flatTensors().size(); ++i) {
    EXPECT_EQ(sharded.optimizer.flatTensors()[i].first, dp.optimizer.flatTensors()[i].first);
    EXPECT_EQ(sharded.optimizer.flatTensors()[i].second.shape(), dp.optimizer.flatTensors()[i].second.shape());
  }
  EXPECT_LT(maxRelDiff(stateValues(sharded.optimizer), stateValues(dp.optimizer)), 1e-5);
  EXPECT_EQ(sharded.optimizer.scalars, dp.optimizer.scalars);

  // On the same ranks the resumed run is the uninterrupted one, bit for bit.
  EXPECT_EQ(train(2, fsdp(opt, full), 5, kSteps - 5, &sharded), straight);

  // Elsewhere the gradients are summed in another order. SGD's update is linear in them;
  // Adam's divides by their magnitude (see FsdpEquivalence), so its bound is looser.
  const double tolerance = opt == Opt::SgdMomentum ? 1e-5 : 1e-3;
  const std::vector<double> onFour =
      train(4, fsdp(opt, {.shard = ShardLevel::Gradients}), 5, kSteps - 5, &sharded);
  EXPECT_LT(maxRelDiff(onFour, straight), tolerance) << "fsdp 2 ranks -> 4";
  const std::vector<double> onOne = train(1, plain(opt, StrategyKind::OneDevice), 5, kSteps - 5, &sharded);
  EXPECT_LT(maxRelDiff(onOne, straight), tolerance) << "fsdp 2 ranks -> one device";
  Saved single;
  train(1, plain(opt, StrategyKind::OneDevice), 0, 5, nullptr, &single);
  const std::vector<double> fromOne = train(2, fsdp(opt, full), 5, kSteps - 5, &single);
  EXPECT_LT(maxRelDiff(fromOne, straight), tolerance) << "one device -> fsdp 2 ranks";
  // An HSDP checkpoint (2 groups of 2) is the same file.
  Saved hybrid;
  train(4, fsdp(opt, {.shard = ShardLevel::Full, .shardGroup = 2}), 0, 5, nullptr, &hybrid);
  EXPECT_LT(maxRelDiff(stateValues(hybrid.optimizer), stateValues(dp.optimizer)), tolerance);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FsdpCheckpoint, ::testing::Values(Opt::SgdMomentum, Opt::AdamW),
                         [](const auto& info) {
                           return std::string(info.param == Opt::SgdMomentum ? "SgdMomentum" : "AdamW");
                         });

// One device with optim::clipGradNorm before every update, global batches in file order.
std::vector<double> oneDeviceClipped(double maxNorm) {
  auto model = makeEquivalenceModel(0);
  auto optimizer = optimizerFor(Opt::SgdMomentum)(model->namedParameters());
  const TrainData& d = trainData();
  for (int s = 0; s < kSteps; ++s) {
    Tensor loss = crossEntropy(model->forward(d.x.slice(0, s * kGlobalBatch, (s + 1) * kGlobalBatch).contiguous()),
                               d.y.slice(0, s * kGlobalBatch, (s + 1) * kGlobalBatch).contiguous());
    optimizer->zeroGrad();
    loss.backward();
    std::vector<Tensor> parameters;
    for (auto& [name, p] : model->namedParameters()) parameters.push_back(p);
    optim::clipGradNorm(parameters, maxNorm);
    optimizer->step();
  }
  return modelValues(*model);
}

TEST(FsdpClipNorm, ClipsTheGlobalNormAsOneDeviceDoes) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const double maxNorm = 0.2;
  const std::vector<double> expected = oneDeviceClipped(maxNorm);
  // The clipping is in effect: without it the weights end elsewhere.
  EXPECT_GT(maxRelDiff(expected, trainOneDevice(kSteps)), 1e-3);
  for (const FsdpOptions& options :
       {FsdpOptions{.shard = ShardLevel::Full, .clipNorm = maxNorm},
        FsdpOptions{.shard = ShardLevel::Gradients, .clipNorm = maxNorm},
        FsdpOptions{.shard = ShardLevel::Full, .shardGroup = 2, .clipNorm = maxNorm}}) {
    for (int n : {2, 4}) {
      if (options.shardGroup > 0 && n == 2) continue;
      const std::string what = std::string(shardLevelName(options.shard)) + " on " + std::to_string(n) +
                               " ranks, shard group " + std::to_string(options.shardGroup);
      EXPECT_LT(maxRelDiff(train(n, fsdp(Opt::SgdMomentum, options), 0, kSteps), expected), 1e-5) << what;
    }
  }
}

class Hsdp : public ::testing::TestWithParam<Opt> {
 protected:
  void SetUp() override { KOLO_SKIP_WITHOUT_FASHION_MNIST(); }
};

// 4 ranks as 2 shard groups of 2 (and 4 groups of 1: replication only) against plain data
// parallelism on 4 ranks.
TEST_P(Hsdp, ShardGroupsReplicatedAcrossMatchDataParallelism) {
  const Opt opt = GetParam();
  const std::vector<double> dp = train(4, plain(opt, StrategyKind::MultiWorkerMirrored), 0, kSteps);
  EXPECT_GT(maxRelDiff(dp, modelValues(*makeEquivalenceModel(0))), 1e-2);
  for (ShardLevel level : {ShardLevel::Gradients, ShardLevel::Full}) {
    for (int group : {2, 1}) {
      const std::vector<double> w = train(4, fsdp(opt, {.shard = level, .shardGroup = group}), 0, kSteps);
      // Adam amplifies the rounding of a different summation order (see fsdp_test.cc).
      EXPECT_LT(maxRelDiff(w, dp), opt == Opt::SgdMomentum ? 1e-5 : 1e-4)
          << shardLevelName(level) << ", groups of " << group;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Hsdp, ::testing::Values(Opt::SgdMomentum, Opt::AdamW),
                         [](const auto& info) {
                           return std::string(info.param == Opt::SgdMomentum ? "SgdMomentum" : "AdamW");
                         });

// kShardGroupPerHost: the shard groups are the launch's local ranks (here torchrun's
// variables say 2 a host), the same run as shard groups of 2; 3 a host do not divide 4 ranks.
TEST(Hsdp, GroupsPerHostAreTheLaunchsLocalRanks) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const std::map<std::string, std::string> launch = {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}};
  for (const auto& [name, value] : launch) ::setenv(name.c_str(), value.c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  const FsdpOptions perHost{.shard = ShardLevel::Full, .shardGroup = kShardGroupPerHost};
  const std::vector<double> twos = train(4, fsdp(Opt::SgdMomentum, {.shard = ShardLevel::Full, .shardGroup = 2}), 0, 3);
  EXPECT_EQ(maxRelDiff(train(4, fsdp(Opt::SgdMomentum, perHost), 0, 3), twos), 0.0);
  ::setenv("LOCAL_WORLD_SIZE", "3", 1);
  auto connect = nativeRanks(4);
  std::vector<std::string> errors(4);
  runThreads(4, [&](int rank) {
    try {
      fsdp(Opt::SgdMomentum, perHost)(connect(rank), rank);
    } catch (const InvalidArgument& e) {
      errors[rank] = e.what();
    }
  });
  for (const auto& [name, value] : launch) ::unsetenv(name.c_str());
  ::unsetenv("LOCAL_WORLD_SIZE");
  for (const std::string& error : errors)
    EXPECT_NE(error.find("shard group of 3 ranks (the ranks of one host) does not divide the job's 4"),
              std::string::npos)
        << error;
}

TEST(Hsdp, RefusesAGroupThatDoesNotDivideTheRanks) {
  auto connect = nativeRanks(3);
  std::vector<std::string> errors(3);
  runThreads(3, [&](int rank) {
    try {
      fsdp(Opt::AdamW, {.shardGroup = 2})(connect(rank), rank);
    } catch (const InvalidArgument& e) {
      errors[rank] = e.what();
    }
  });
  for (const std::string& error : errors)
    EXPECT_NE(error.find("shard group of 2 ranks does not divide the job's 3"), std::string::npos) << error;
}

}  // namespace
}  // namespace kolo::parallel
