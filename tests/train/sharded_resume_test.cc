// A sharded dataset under train::fit: 8 .npz shards (written by NumPy), ranks as threads.
// The global batches' sample ids of a run stopped on 2 ranks and resumed on 1 (and the other
// way) are those of an uninterrupted run, step for step; each epoch visits every sample once;
// and a rank opens only the shards its part of a batch falls in.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "../data/files_support.h"
#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/sharded.h"
#include "kolo/train/fit.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

using parallel::testing::nativeRanks;
using parallel::testing::runThreads;

constexpr int64_t kShards = 8, kPerShard = 20, kBatch = 16, kSteps = 14;  // 10 steps an epoch

// Global batch ids per step: each rank's part, in rank order.
using Record = std::map<int64_t, std::vector<int64_t>>;

struct Shards {
  data::testing::ScratchDir dir;
  Shards() {
    data::testing::runPython(dir.path(), R"(
for s in range(8):
    x = np.arange(s * 20 * 6, (s + 1) * 20 * 6, dtype=np.float32).reshape(20, 6) / 960
    np.savez('shard-%d.npz' % s, x=x, y=(np.arange(20) + s) % 3)
)");
  }
};

// Trains on `ranks` thread ranks (0: one process) from `resumeDir` (if any) and records the
// global batches; with `stopAt` >= 0 every rank throws before that step (checkpoints every
// 3 steps into `checkpointDir`). `opened` gets each rank's opened shards after step 0.
Record run(const std::string& pattern, int ranks, int64_t stopAt, const std::string& checkpointDir,
           const std::string& resumeDir, std::vector<int64_t>* opened = nullptr) {
  Record record;
  std::mutex mutex;
  std::map<int64_t, std::map<int, std::vector<int64_t>>> parts;
  auto body = [&](std::shared_ptr<comm::Communicator> comm) {
    const auto dataset = data::openShards(pattern);
    DataParallelOptions options;
    options.strategy.kind = comm ? parallel::StrategyKind::MultiWorkerMirrored : parallel::StrategyKind::OneDevice;
    options.strategy.communicator = comm;
    auto model = [] {
      Generator gen(1);
      return std::make_shared<nn::Linear>(6, 3, gen);
    };
    DataParallelEngine engine(model, testing::sgd, options);
    observe::Logger logger(stderr, observe::LogLevel::Warn);
    FitOptions fit = testing::quietFit(kBatch, kSteps, logger);
    fit.seed = 17;
    fit.checkpointDir = checkpointDir;
    fit.checkpointEvery = 3;
    fit.resumeDir = resumeDir;
    FitCallbacks callbacks;
    callbacks.onStepBegin = [&](int64_t step) {
      if (step == stopAt) KOLO_THROW(Error, "stopped before step ", step);
    };
    callbacks.onStepEnd = [&, rank = engine.rank()](const StepEnd& end) {
      std::lock_guard lock(mutex);
      parts[end.step][rank] = end.batch->indices;
      if (end.step == 0 && opened) (*opened)[size_t(rank)] = dataset->openedShards();
    };
    train::fit(engine, dataset, nullptr, fit, callbacks);
  };
  try {
    if (ranks == 0) {
      body(nullptr);
    } else {
      auto make = nativeRanks(ranks);
      runThreads(ranks, [&](int rank) { body(make(rank)); });
    }
  } catch (const Error& e) {
    if (stopAt < 0) throw;
  }
  for (const auto& [step, byRank] : parts)
    for (const auto& [rank, ids] : byRank) record[step].insert(record[step].end(), ids.begin(), ids.end());
  return record;
}

// The steps of a stopped run before its last checkpoint, then the resumed run's.
Record joined(const Record& stopped, const Record& resumed) {
  Record out;
  for (const auto& [step, ids] : stopped)
    if (step < 6) out[step] = ids;  // the checkpoint of step 6 is where the resumed run starts
  for (const auto& [step, ids] : resumed) out[step] = ids;
  return out;
}

TEST(ShardedResume, StoppedOnTwoRanksResumedOnOneTakesTheSameSamplesInOrder) {
  if (!data::testing::havePythonNumpy()) GTEST_SKIP() << "python3-numpy missing";
  Shards shards;
  const std::string pattern = shards.dir / "shard-*.npz";
  std::vector<int64_t> opened(2, -1);
  const Record straight = run(pattern, 0, -1, "", "");
  ASSERT_EQ(straight.size(), size_t(kSteps));
  // Every sample once per epoch, in a shuffled order.
  std::set<int64_t> epoch;
  for (int64_t step = 0; step < 10; ++step) epoch.insert(straight.at(step).begin(), straight.at(step).end());
  EXPECT_EQ(epoch.size(), size_t(kShards * kPerShard));
  EXPECT_NE(straight.at(0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));

  const std::string twoToOne = shards.dir / "ckpt-2to1";
  const Record stoppedOnTwo = run(pattern, 2, 8, twoToOne, "", &opened);
  const Record resumedOnOne = run(pattern, 0, -1, twoToOne, twoToOne);
  EXPECT_EQ(resumedOnOne.begin()->first, 6) << "the resumed run did not start at the checkpoint";
  EXPECT_EQ(joined(stoppedOnTwo, resumedOnOne), straight);
  // A global batch mixes 4 shards at most: each rank opened no more for its half of step 0.
  for (const int64_t count : opened) {
    EXPECT_GE(count, 1);
    EXPECT_LE(count, 4);
  }

  const std::string oneToTwo = shards.dir / "ckpt-1to2";
  const Record stoppedOnOne = run(pattern, 0, 8, oneToTwo, "");
  const Record resumedOnTwo = run(pattern, 2, -1, oneToTwo, oneToTwo);
  EXPECT_EQ(joined(stoppedOnOne, resumedOnTwo), straight);
}

TEST(ShardedResume, TheShuffledOrderDependsOnTheSeedAndEpochOnly) {
  if (!data::testing::havePythonNumpy()) GTEST_SKIP() << "python3-numpy missing";
  Shards shards;
  const auto a = data::openShards(shards.dir / "shard-*.npz");
  const auto b = data::openShards(shards.dir / "shard-*.npz");
  EXPECT_EQ(a->shuffledOrder(3, 1), b->shuffledOrder(3, 1));
  EXPECT_NE(a->shuffledOrder(3, 1), a->shuffledOrder(3, 2));
  EXPECT_EQ(a->openedShards(), 0) << "counting opened a shard's inputs";
  // The first 80 samples of an epoch come from 4 shards (one block).
  const std::vector<int64_t> order = a->shuffledOrder(3, 0);
  std::set<int64_t> firstBlock;
  for (int i = 0; i < 80; ++i) firstBlock.insert(a->shardOf(order[size_t(i)]));
  EXPECT_EQ(firstBlock.size(), 4u);
  const data::Batch batch = a->gather({45, 3});
  EXPECT_FLOAT_EQ(batch.inputs.data<float>()[0], 45 * 6 / 960.0f);
  EXPECT_EQ(batch.labels.data<int64_t>()[1], 3 % 3);
  EXPECT_EQ(batch.labels.data<int64_t>()[0], (5 + 2) % 3);
  EXPECT_THROW(data::openShards(shards.dir / "none-*.npz"), FileError);
}

}  // namespace
}  // namespace kolo::train
