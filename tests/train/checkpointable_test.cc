// train::Checkpointable: a loop of one's own over a DistributedOptimizer saves its model and
// optimizer with train::save and gets them back with train::load on every rank: rank 0
// reads, and every rank ends with rank 0's weights and optimizer state, whatever it held.
#include "kolo/train/checkpointable.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

using parallel::testing::nativeRanks;
using parallel::testing::runThreads;
using testing::weights;

std::shared_ptr<nn::Module> smallModel(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 3, gen)});
}

TEST(Checkpointable, ALoopOfOnesOwnSavesAndLoadsOnEveryRank) {
  const std::string dir = testing::freshDir("kolo_checkpointable", "loop");
  const auto data = testing::linearDataset(32, 4, 6, 3);
  constexpr int kRanks = 2;
  std::vector<std::vector<float>> saved(kRanks), loaded(kRanks), savedMomentum(kRanks),
      loadedMomentum(kRanks);
  auto momentumOf = [](optim::Optimizer& optimizer) {
    std::vector<float> flat;
    for (const auto& [name, slots] : optimizer.stateDict().perParameter)
      for (const auto& [slot, t] : slots) {
        const std::vector<float> v = t.toFloatVector();
        flat.insert(flat.end(), v.begin(), v.end());
      }
    return flat;
  };
  auto connect = nativeRanks(kRanks);
  runThreads(kRanks, [&](int rank) {
    auto comm = connect(rank);
    auto model = smallModel(1);
    auto optimizer = std::make_shared<parallel::DistributedOptimizer>(
        testing::sgd(model->namedParameters()), comm);
    for (int step = 0; step < 3; ++step) {
      optimizer->zeroGrad();
      const data::Batch batch = data->gather({8 * rank + 0, 8 * rank + 1, 8 * rank + 2, 8 * rank + 3});
      crossEntropy(model->forward(batch.inputs), batch.labels).backward();
      optimizer->step();
    }
    Checkpointable state(model, optimizer);
    save({&state}, {.step = 3, .loader = {}, .path = ""}, {.directory = dir, .communicator = comm});
    saved[rank] = weights(*model);
    savedMomentum[rank] = momentumOf(optimizer->optimizer());

    // A fresh model of other weights (other on each rank) and a fresh optimizer.
    auto fresh = smallModel(10 + rank);
    parallel::ReducerOptions keepOwn;
    keepOwn.broadcastParameters = false;
    auto freshOptimizer = std::make_shared<parallel::DistributedOptimizer>(
        testing::sgd(fresh->namedParameters()), comm, keepOwn);
    Checkpointable into(fresh, freshOptimizer);
    const Position position = load({&into}, {.directory = dir, .communicator = comm});
    EXPECT_EQ(position.step, 3);
    loaded[rank] = weights(*fresh);
    loadedMomentum[rank] = momentumOf(freshOptimizer->optimizer());
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(loaded[rank], saved[0]) << "rank " << rank;
    EXPECT_EQ(loadedMomentum[rank], savedMomentum[0]) << "rank " << rank;
  }
  EXPECT_FALSE(savedMomentum[0].empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kolo::train
