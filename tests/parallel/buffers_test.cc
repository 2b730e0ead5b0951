// Buffers under data parallelism (DDP's broadcast_buffers): a model whose first layer is a
// BatchNorm1d, so its running statistics depend on the data alone and equal, bit for bit,
// one BatchNorm1d fed root's shards in order (the single-device computation). Every rank
// ends each step with root's buffers: the Reducer over in-process replicas and over the
// native communicator with real ranks (strategy, DistributedOptimizer, sharded update,
// uneven inputs with join), Mirrored and CentralStorage.
#include <gtest/gtest.h>

#include "kolo/nn/layers.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/strategy.h"
#include "native_ranks.h"
#include "toy_setup.h"

namespace kolo::parallel {
namespace {
using namespace testing;

constexpr int64_t kShard = 8;  // samples per rank per step

std::shared_ptr<nn::Sequential> bnModel(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::BatchNorm1d>(kIn));
  model->add(std::make_shared<nn::Linear>(kIn, kClasses, gen));
  return model;
}

std::unique_ptr<optim::Optimizer> sgd(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.1});
}

// Rows of rank `rank`'s shard at step `step` in a job of `ranks` ranks.
int64_t shardStart(int step, int rank, int ranks) { return (int64_t{step} * ranks + rank) * kShard; }

// The buffers of one BatchNorm1d fed rank `rank`'s shards, after each step.
std::vector<std::vector<double>> replay(const ToyData& data, int rank, int ranks, int steps) {
  nn::BatchNorm1d bn(kIn);
  std::vector<std::vector<double>> out;
  for (int s = 0; s < steps; ++s) {
    const int64_t lo = shardStart(s, rank, ranks);
    bn.forward(data.rows(lo, lo + kShard, false));
    out.push_back(flatValues(bn.namedBuffers()));
  }
  return out;
}

class ReducerBuffers : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ReducerBuffers, EveryRankEndsEachStepWithRootsBuffers) {
  const auto [k, broadcast] = GetParam();
  const int steps = 3;
  const ToyData data = makeToyData(k * kShard * steps);
  auto comms = makeReplicaGroup(k, LocalReduction::Ring);
  std::vector<std::vector<std::vector<double>>> buffers(k);
  std::vector<std::vector<double>> params(k);
  runThreads(k, [&](int r) {
    auto model = bnModel(100 + r);
    ReducerOptions options;
    options.broadcastBuffers = broadcast;
    Reducer reducer(*model, comms[r], options);
    EXPECT_EQ(reducer.buffers().size(), 3u);
    auto opt = sgd(model->namedParameters());
    for (int s = 0; s < steps; ++s) {
      opt->zeroGrad();
      const int64_t lo = shardStart(s, r, k);
      crossEntropy(model->forward(data.rows(lo, lo + kShard, false)),
                   data.rows(lo, lo + kShard, true))
          .backward();
      reducer.finalize();
      opt->step();
      buffers[r].push_back(flatValues(model->namedBuffers()));
    }
    params[r] = flatValues(model->namedParameters());
  });
  for (int r = 0; r < k; ++r) {
    const auto expected = replay(data, broadcast ? 0 : r, k, steps);
    for (int s = 0; s < steps; ++s)
      EXPECT_EQ(buffers[r][s], expected[s]) << "rank " << r << " step " << s;
    EXPECT_EQ(params[r], params[0]) << "rank " << r;
  }
  if (!broadcast && k > 1) {
    EXPECT_NE(buffers[1].back(), buffers[0].back());
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndBroadcast, ReducerBuffers,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

enum class Path { Strategy, DistributedOptimizer, ShardedUpdate };

std::string pathName(const std::tuple<int, Path>& param) {
  static const char* const kNames[] = {"strategy", "distributed_optimizer", "sharded_update"};
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.
  std::string name = std::to_string(std::get<0>(param));
  name.insert(0, 1, 'n');
  name += '_';
  name += kNames[static_cast<int>(std::get<1>(param))];
  return name;
}

class NativeBuffers : public ::testing::TestWithParam<std::tuple<int, Path>> {};

TEST_P(NativeBuffers, EveryRankHasRootsBuffersAfterEachStep) {
  const auto [n, path] = GetParam();
  const int steps = 3;
  const ToyData data = makeToyData(n * kShard * steps);
  auto connect = nativeRanks(n);
  std::vector<std::vector<std::vector<double>>> buffers(n);
  std::vector<std::vector<double>> params(n);
  runThreads(n, [&](int rank) {
    auto comm = connect(rank);
    std::unique_ptr<Strategy> strategy;
    std::unique_ptr<DistributedOptimizer> optimizer;
    std::shared_ptr<nn::Module> model;
    if (path == Path::Strategy) {
      StrategyOptions options;
      options.kind = StrategyKind::MultiWorkerMirrored;
      options.communicator = comm;
      strategy = makeStrategy(options, [rank] { return bnModel(200 + rank); }, sgd);
    } else {
      model = bnModel(200 + rank);
      ReducerOptions options;
      options.shardOptimizer = path == Path::ShardedUpdate;
      optimizer = std::make_unique<DistributedOptimizer>(sgd(model->namedParameters()), comm,
                                                         *model, options);
      EXPECT_EQ(optimizer->reducer().sharded(), path == Path::ShardedUpdate);
    }
    nn::Module& m = strategy ? strategy->model() : *model;
    for (int s = 0; s < steps; ++s) {
      const int64_t lo = shardStart(s, rank, n);
      const Tensor x = data.rows(lo, lo + kShard, false), y = data.rows(lo, lo + kShard, true);
      if (strategy) {
        strategy->trainStep(x, y);
      } else {
        optimizer->zeroGrad();
        crossEntropy(model->forward(x), y).backward();
        optimizer->step();
      }
      buffers[rank].push_back(flatValues(m.namedBuffers()));
    }
    params[rank] = flatValues(m.namedParameters());
  });
  const auto expected = replay(data, 0, n, steps);
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < steps; ++s)
      EXPECT_EQ(buffers[r][s], expected[s]) << "rank " << r << " step " << s;
    EXPECT_EQ(params[r], params[0]) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndPaths, NativeBuffers,
    ::testing::Combine(::testing::Values(2, 3), ::testing::Values(Path::Strategy,
                                                                  Path::DistributedOptimizer,
                                                                  Path::ShardedUpdate)),
    [](const auto& info) { return pathName(info.param); });

// Uneven inputs: rank 1 stops after one step and joins while rank 0 trains two more. The
// buffers are left alone while rank 1 has joined, and join() gives both rank 0's, the rank
// that trained the most.
TEST(NativeBuffersJoin, JoinEndsWithTheBuffersOfTheRankThatTrainedMost) {
  const int n = 2;
  const std::vector<int> stepsOf{3, 1};
  const ToyData data = makeToyData(n * kShard * 3);
  auto connect = nativeRanks(n);
  std::vector<std::vector<double>> buffers(n);
  runThreads(n, [&](int rank) {
    auto comm = connect(rank);
    auto model = bnModel(300 + rank);
    DistributedOptimizer optimizer(sgd(model->namedParameters()), comm, *model);
    for (int s = 0; s < stepsOf[rank]; ++s) {
      const int64_t lo = shardStart(s, rank, n);
      optimizer.zeroGrad();
      crossEntropy(model->forward(data.rows(lo, lo + kShard, false)),
                   data.rows(lo, lo + kShard, true))
          .backward();
      optimizer.step();
    }
    EXPECT_EQ(optimizer.join(), rank == 1 ? 2 : 0);
    buffers[rank] = flatValues(model->namedBuffers());
  });
  const auto expected = replay(data, 0, n, 3);
  EXPECT_EQ(buffers[0], expected.back());
  EXPECT_EQ(buffers[1], expected.back());
}

// In-process strategies: replica 0's shard of each global batch decides the buffers.
TEST(StrategyBuffers, MirroredAndCentralStorageKeepReplicaZerosBuffers) {
  const int k = 2, steps = 3;
  const ToyData data = makeToyData(k * kShard * steps);
  for (StrategyKind kind : {StrategyKind::Mirrored, StrategyKind::CentralStorage}) {
    SCOPED_TRACE(strategyKindName(kind));
    StrategyOptions options;
    options.kind = kind;
    options.replicas = k;
    uint64_t seed = 400;
    auto strategy = makeStrategy(options, [&seed] { return bnModel(seed++); }, sgd);
    const auto expected = replay(data, 0, k, steps);
    for (int s = 0; s < steps; ++s) {
      const int64_t lo = shardStart(s, 0, k), hi = lo + k * kShard;
      strategy->trainStep(data.rows(lo, hi, false), data.rows(lo, hi, true));
      EXPECT_EQ(flatValues(strategy->model().namedBuffers()), expected[s]) << "step " << s;
    }
  }
}

}  // namespace
}  // namespace kolo::parallel
