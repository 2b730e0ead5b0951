// Tensor parallelism = the unsplit model: the lm (attention split by heads, MLP column- then
// row-parallel) and the mlp (Linear pairs) on T = 2 and 4 ranks as threads over the native
// communicator train 10 SGD steps to the one-rank losses and weights (1e-5 of the largest);
// shards cut and reassemble any block layout; sizes that do not divide are named.
#include <gtest/gtest.h>

#include "kolo/parallel/tensor_parallel.h"
#include "pipeline_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

std::shared_ptr<nn::Sequential> tpModel(const std::string& model) {
  Generator gen(99);
  if (model == "mlp") return nn::makeModel("mlp", gen);
  // 4 heads of width 4, MLP 64: divisible by T = 2 and 4.
  return nn::makeLanguageModel({.vocab = 24, .layers = 2, .dModel = 16, .heads = 4, .seqLen = 6}, gen);
}

PipeResult trainTp(const std::string& model, int parts, int steps) {
  PipeResult result;
  std::vector<std::vector<double>> losses(static_cast<size_t>(parts));
  auto commFor = nativeRanks(parts);
  auto whole = tpModel(model);
  runThreads(parts, [&](int rank) {
    auto comm = commFor(rank);
    TensorParallelModel tp(*tpModel(model), comm);
    auto optimizer = pipeOptimizer(tp.namedParameters());
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = pipeBatch(model, s);
      optimizer->zeroGrad();
      Tensor l = pipeLoss(model)(tp.forward(x), y);
      l.backward();
      optimizer->step();
      losses[static_cast<size_t>(rank)].push_back(l.item());
    }
    tp.gatherInto(rank == 0 ? whole.get() : nullptr, 0);
  });
  for (int r = 1; r < parts; ++r)
    if (losses[static_cast<size_t>(r)] != losses[0]) ADD_FAILURE() << "rank " << r << " computed other losses";
  result.losses = losses[0];
  result.state = whole->stateDict();
  return result;
}

PipeResult trainWhole(const std::string& model, int steps) {
  auto m = tpModel(model);
  auto optimizer = pipeOptimizer(m->namedParameters());
  PipeResult result;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = pipeBatch(model, s);
    optimizer->zeroGrad();
    Tensor l = pipeLoss(model)(m->forward(x), y);
    l.backward();
    optimizer->step();
    result.losses.push_back(l.item());
  }
  result.state = m->stateDict();
  return result;
}

class TensorParallelEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelEquivalence, MatchesUnsplitModel) {
  const auto [model, parts] = GetParam();
  const int steps = model == "lm" ? 10 : 5;
  const PipeResult want = trainWhole(model, steps);
  const PipeResult got = trainTp(model, parts, steps);
  EXPECT_LT(maxRelDiff(got.losses, want.losses), 1e-5);
  EXPECT_LT(maxRelDiff(stateValues(got.state), stateValues(want.state)), 1e-5);
  EXPECT_GT(want.losses[0] - want.losses[(want.losses.size() - 1) & ~size_t{1}], 0.02) << "the reference does not learn";
}

INSTANTIATE_TEST_SUITE_P(ModelsAndRanks, TensorParallelEquivalence,
                         ::testing::Combine(::testing::Values("lm", "mlp"), ::testing::Values(2, 4)));

TEST(TensorParallelShards, ShardsOfBlocksReassemble) {
  const Tensor full = Tensor::arange(24).reshape({12, 2});
  // Three blocks of 4 rows over 2 ranks: rank 1 gets rows 2-3, 6-7, 10-11.
  EXPECT_EQ(shardTensor(full, 0, 3, 1, 2).toFloatVector(),
            (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23}));
  EXPECT_EQ(shardTensor(full, 1, 1, 0, 2).toFloatVector(),
            (std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
  EXPECT_THROW(shardTensor(full, 0, 3, 0, 3), InvalidArgument);
}

TEST(TensorParallelShards, HeadsThatDoNotDivideAreNamed) {
  auto commFor = nativeRanks(3);
  runThreads(3, [&](int rank) {
    auto comm = commFor(rank);
    try {
      TensorParallelModel tp(*tpModel("lm"), comm);
      ADD_FAILURE() << "4 heads were split over 3 ranks";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("4 attention heads cannot be split over 3 ranks"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace kolo::parallel
