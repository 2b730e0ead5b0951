// Tensor parallelism = the unsplit model: the lm (embedding and head split by vocabulary,
// attention by heads, MLP column- then row-parallel; with and without sequence-parallel norms)
// and the mlp (Linear pairs) on T = 2 and 4 ranks as threads over the native communicator
// train 10 SGD steps to the one-rank losses and weights (1e-5 of the largest); the
// vocabulary-parallel cross-entropy and its gradient equal the whole one; shards cut and
// reassemble any block layout; sizes that do not divide are named.
#include <gtest/gtest.h>

#include "kolo/parallel/tensor_parallel.h"
#include "pipeline_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

// Prints a measured difference (the figures docs/model_parallel.md quotes) and returns it.
double report(double difference, const char* what) {
  std::printf("    largest relative difference of the %s: %.2g\n", what, difference);
  return difference;
}

// Sequence-parallel runs use 8 tokens (divisible by T = 2 and 4), the others 6.
constexpr int64_t kSpTokens = 8;

std::shared_ptr<nn::Sequential> tpModel(const std::string& model) {
  Generator gen(99);
  if (model == "mlp") return nn::makeModel("mlp", gen);
  // 4 heads of width 4, MLP 64, vocabulary 24: divisible by T = 2 and 4.
  return nn::makeLanguageModel(
      {.vocab = 24, .layers = 2, .dModel = 16, .heads = 4, .seqLen = kSpTokens}, gen);
}

// The default plan of kolo's own blocks, sequence-parallel or not.
TensorParallelPlan planOf(const nn::Module& model, bool sequenceParallel = false) {
  TensorParallelPlan plan = defaultPlan(model);
  plan.sequenceParallel = sequenceParallel;
  return plan;
}

std::shared_ptr<TensorParallelModel> split(std::shared_ptr<nn::Sequential> model,
                                           std::shared_ptr<comm::Communicator> comm,
                                           bool sequenceParallel = false) {
  const TensorParallelPlan plan = planOf(*model, sequenceParallel);
  return std::make_shared<TensorParallelModel>(std::move(model), std::move(comm), plan);
}

PipeResult trainTp(const std::string& model, int parts, int steps, bool sequenceParallel = false) {
  const int64_t tokens = sequenceParallel ? kSpTokens : 6;
  PipeResult result;
  std::vector<std::vector<double>> losses(static_cast<size_t>(parts));
  auto commFor = nativeRanks(parts);
  auto whole = tpModel(model);
  runThreads(parts, [&](int rank) {
    auto comm = commFor(rank);
    const auto held = split(tpModel(model), comm, sequenceParallel);
    TensorParallelModel& tp = *held;
    auto optimizer = pipeOptimizer(tp.module().namedParameters());
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = pipeBatch(model, s, tokens);
      optimizer->zeroGrad();
      Tensor l = tp.loss(tp.forward(x), y);
      l.backward();
      tp.synchronizeGradients();
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

PipeResult trainWhole(const std::string& model, int steps, int64_t tokens = 6) {
  auto m = tpModel(model);
  auto optimizer = pipeOptimizer(m->namedParameters());
  PipeResult result;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = pipeBatch(model, s, tokens);
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
  EXPECT_LT(report(maxRelDiff(got.losses, want.losses), "losses"), 1e-5);
  EXPECT_LT(report(maxRelDiff(stateValues(got.state), stateValues(want.state)), "weights"), 1e-5);
  EXPECT_GT(want.losses[0] - want.losses[(want.losses.size() - 1) & ~size_t{1}], 0.02) << "the reference does not learn";
}

INSTANTIATE_TEST_SUITE_P(ModelsAndRanks, TensorParallelEquivalence,
                         ::testing::Combine(::testing::Values("lm", "mlp"), ::testing::Values(2, 4)));

class SequenceParallelEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(SequenceParallelEquivalence, MatchesUnsplitModel) {
  const int parts = GetParam();
  const PipeResult want = trainWhole("lm", 10, kSpTokens);
  const PipeResult got = trainTp("lm", parts, 10, true);
  EXPECT_LT(report(maxRelDiff(got.losses, want.losses), "losses"), 1e-5);
  EXPECT_LT(report(maxRelDiff(stateValues(got.state), stateValues(want.state)), "weights"), 1e-5);
  EXPECT_GT(want.losses[0] - want.losses[8], 0.02) << "the reference does not learn";
}

INSTANTIATE_TEST_SUITE_P(Ranks, SequenceParallelEquivalence, ::testing::Values(2, 4));

TEST(TensorParallelLayers, EmbeddingAndHeadAreSplitByVocabulary) {
  auto commFor = nativeRanks(2);
  const auto whole = tpModel("lm");
  runThreads(2, [&](int rank) {
    const auto held = split(tpModel("lm"), commFor(rank));
    TensorParallelModel& tp = *held;
    EXPECT_TRUE(tp.outputSplitByVocabulary());
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : tp.module().namedParameters()) shapes[name] = t.shape();
    EXPECT_EQ(shapes.at("0.tok.weight"), (Shape{12, 16}));
    EXPECT_EQ(shapes.at("0.pos.weight"), (Shape{kSpTokens, 16}));
    EXPECT_EQ(shapes.at("4.weight"), (Shape{12, 16}));  // the head: 24 classes over 2 ranks
    EXPECT_EQ(shapes.size(), whole->namedParameters().size()) << "the whole model's names";
    auto [x, y] = pipeBatch("lm", 0);
    EXPECT_EQ(tp.forward(x).shape(), (Shape{kPipeBatch, 6, 12}));
  });
}

// Split logits (N, V/T) on T ranks give the whole cross-entropy and, per rank, its columns
// of the whole gradient.
TEST(TensorParallelLayers, VocabParallelCrossEntropyEqualsTheWholeOne) {
  for (int parts : {1, 2, 3, 4}) {
    Generator gen(5);
    const Tensor logits = Tensor::randn({10, 24}, gen) * 3.0;
    std::vector<int64_t> ids;
    for (int i = 0; i < 10; ++i) ids.push_back(static_cast<int64_t>(gen.nextU64() % 24));
    const Tensor targets = Tensor::fromVector({10}, ids);
    Tensor whole = logits.clone();
    whole.setRequiresGrad(true);
    Tensor wantLoss = crossEntropy(whole, targets);
    wantLoss.backward();
    auto commFor = nativeRanks(parts);
    runThreads(parts, [&](int rank) {
      Tensor mine = shardTensor(logits, 1, 1, rank, parts);
      mine.setRequiresGrad(true);
      Tensor loss = vocabParallelCrossEntropy(mine, targets, commFor(rank));
      loss.backward();
      EXPECT_NEAR(loss.item(), wantLoss.item(), 1e-5 * std::abs(wantLoss.item()))
          << parts << " ranks";
      EXPECT_LT(maxRelDiff(mine.grad().toDoubleVector(),
                           shardTensor(whole.grad(), 1, 1, rank, parts).toDoubleVector()),
                1e-5)
          << "rank " << rank << " of " << parts;
    });
  }
}

// A split block calls its children through operator(), as nn::TransformerBlock does: the
// forward hooks on each of its children fire, in order, on every rank.
TEST(TensorParallelLayers, ABlocksChildrenFireTheirHooks) {
  auto commFor = nativeRanks(2);
  std::vector<std::vector<std::string>> fired(2);
  runThreads(2, [&](int rank) {
    const auto held = split(tpModel("lm"), commFor(rank));
    TensorParallelModel& tp = *held;
    for (auto& [name, module] : tp.module().namedModules()) {
      if (name.rfind("1.", 0) != 0) continue;  // the children of block "1"
      module->addForwardHook(
          [&fired, rank, name](nn::Module&, const Tensor&) { fired[static_cast<size_t>(rank)].push_back(name); });
    }
    tp.forward(pipeBatch("lm", 0, 6).first);
  });
  const std::vector<std::string> order = {"1.ln1", "1.attn.qkv", "1.attn.proj", "1.attn", "1.ln2",
                                          "1.mlp.0", "1.mlp.1", "1.mlp.2", "1.mlp"};
  for (int r = 0; r < 2; ++r) EXPECT_EQ(fired[static_cast<size_t>(r)], order) << "rank " << r;
}

TEST(TensorParallelShards, ShardsOfBlocksReassemble) {
  const Tensor full = Tensor::arange(24).reshape({12, 2});
  // Three blocks of 4 rows over 2 ranks: rank 1 gets rows 2-3, 6-7, 10-11.
  EXPECT_EQ(shardTensor(full, 0, 3, 1, 2).toFloatVector(),
            (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23}));
  EXPECT_EQ(shardTensor(full, 1, 1, 0, 2).toFloatVector(),
            (std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
  EXPECT_THROW(shardTensor(full, 0, 3, 0, 3), InvalidArgument);
  for (int blocks : {1, 3}) {
    std::vector<Tensor> parts;
    for (int r = 0; r < 2; ++r) parts.push_back(shardTensor(full, 0, blocks, r, 2));
    EXPECT_EQ(unshardTensor(parts, 0, blocks).toFloatVector(), full.toFloatVector())
        << blocks << " blocks";
  }
}

TEST(TensorParallelShards, HeadsThatDoNotDivideAreNamed) {
  auto commFor = nativeRanks(3);
  runThreads(3, [&](int rank) {
    auto comm = commFor(rank);
    try {
      split(tpModel("lm"), comm);
      ADD_FAILURE() << "4 heads were split over 3 ranks";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("4 attention heads cannot be split over 3 ranks"), std::string::npos)
          << e.what();
    }
  });
  // A vocabulary of 24 over 5 ranks; a sequence of 6 tokens over 4 ranks.
  auto odd = [] {
    Generator gen(1);
    return nn::makeLanguageModel({.vocab = 24, .layers = 1, .dModel = 20, .heads = 5, .seqLen = 6}, gen);
  };
  auto five = nativeRanks(5);
  runThreads(5, [&](int rank) {
    try {
      split(odd(), five(rank));
      ADD_FAILURE() << "a vocabulary of 24 was split over 5 ranks";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("vocabulary of 24 tokens cannot be split over 5 ranks"),
                std::string::npos)
          << e.what();
    }
  });
  auto four = nativeRanks(4);
  runThreads(4, [&](int rank) {
    const auto held = split(tpModel("lm"), four(rank), true);
    TensorParallelModel& tp = *held;
    auto [x, y] = pipeBatch("lm", 0, 6);
    try {
      tp.forward(x);
      ADD_FAILURE() << "6 tokens were split over 4 ranks";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("6 tokens cannot be split over 4 ranks"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace kolo::parallel
