// A tensor-parallel plan over a model of the user's own classes (a LLaMA-shaped decoder
// whose attention has separate q, k, v and output Linears and fewer key/value heads than
// query heads, a Linear-GELU-Linear mlp, LayerNorms, a plain embedding and head, not a
// Sequential at the root): on T = 2 ranks as threads, each rank holds 1/T of every split
// parameter, and ten SGD steps equal one device's (with and without sequence parallelism);
// plans that match nothing, do not divide or split nothing are refused, naming why.
#include <gtest/gtest.h>

#include "kolo/parallel/tensor_parallel.h"
#include "kolo/train/model_parallel.h"
#include "pipeline_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

constexpr int64_t kVocab = 24, kWidth = 16, kHeadDim = 4, kHeads = 4, kKvHeads = 2, kHidden = 32;
constexpr int64_t kTokens = 8;

// Grouped-query attention written by the user: the heads follow from the projections'
// widths (so a plan can split q, k and v by heads), each key/value head repeated for its
// group of query heads, then kolo's fused causal attention.
class UserAttention : public nn::Module {
 public:
  explicit UserAttention(Generator& gen) {
    q_ = registerModule("q", std::make_shared<nn::Linear>(kWidth, kHeads * kHeadDim, gen, false));
    k_ = registerModule("k", std::make_shared<nn::Linear>(kWidth, kKvHeads * kHeadDim, gen, false));
    v_ = registerModule("v", std::make_shared<nn::Linear>(kWidth, kKvHeads * kHeadDim, gen, false));
    o_ = registerModule("o", std::make_shared<nn::Linear>(kHeads * kHeadDim, kWidth, gen));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor q = (*q_)(x), k = (*k_)(x), v = (*v_)(x);  // (B, T, h·hd), (B, T, kv·hd)
    const int64_t heads = q.size(2) / kHeadDim, kvHeads = k.size(2) / kHeadDim;
    auto repeat = [&](const Tensor& t) {
      std::vector<Tensor> columns;
      for (int64_t j = 0; j < kvHeads; ++j)
        for (int64_t g = 0; g < heads / kvHeads; ++g)
          columns.push_back(t.slice(2, j * kHeadDim, (j + 1) * kHeadDim));
      return cat(columns, 2);
    };
    return (*o_)(causalAttention(cat({q, repeat(k), repeat(v)}, 2), heads));
  }

 private:
  std::shared_ptr<nn::Linear> q_, k_, v_, o_;
};

class UserMlp : public nn::Module {
 public:
  explicit UserMlp(Generator& gen) {
    up_ = registerModule("up", std::make_shared<nn::Linear>(kWidth, kHidden, gen));
    down_ = registerModule("down", std::make_shared<nn::Linear>(kHidden, kWidth, gen));
  }
  Tensor forward(const Tensor& x) override { return (*down_)(gelu((*up_)(x))); }

 private:
  std::shared_ptr<nn::Linear> up_, down_;
};

class UserBlock : public nn::Module {
 public:
  explicit UserBlock(Generator& gen) {
    norm1_ = registerModule("norm1", std::make_shared<nn::LayerNorm>(Shape{kWidth}));
    attn_ = registerModule("attn", std::make_shared<UserAttention>(gen));
    norm2_ = registerModule("norm2", std::make_shared<nn::LayerNorm>(Shape{kWidth}));
    mlp_ = registerModule("mlp", std::make_shared<UserMlp>(gen));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = x + (*attn_)((*norm1_)(x));
    return h + (*mlp_)((*norm2_)(h));
  }

 private:
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<UserAttention> attn_;
  std::shared_ptr<UserMlp> mlp_;
};

class UserModel : public nn::Module {
 public:
  UserModel() {
    Generator gen(31);
    embed_ = registerModule("embed", std::make_shared<nn::Embedding>(kVocab, kWidth, gen));
    blocks_ = registerModule("blocks", std::make_shared<nn::Sequential>());
    for (int i = 0; i < 2; ++i) blocks_->add(std::make_shared<UserBlock>(gen));
    norm_ = registerModule("norm", std::make_shared<nn::LayerNorm>(Shape{kWidth}));
    head_ = registerModule("head", std::make_shared<nn::Linear>(kWidth, kVocab, gen, false));
  }
  Tensor forward(const Tensor& ids) override {
    return (*head_)((*norm_)((*blocks_)((*embed_)(ids))));  // (B, T, V)
  }

 private:
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::Sequential> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> head_;
};

TensorParallelPlan userPlan(bool sequenceParallel = false) {
  return {.name = "user",
          .styles = {{"embed", vocabularyEmbedding()},
                     {"*.attn.q", columnWiseHeads(kHeadDim)},
                     {"*.attn.k", columnWiseHeads(kHeadDim)},
                     {"*.attn.v", columnWiseHeads(kHeadDim)},
                     {"*.attn.o", rowWiseHeads(kHeadDim)},
                     {"blocks.*.mlp.up", columnWise()},
                     {"blocks.*.mlp.down", rowWise()},
                     {"*norm*", sequenceNorm()},
                     {"head", vocabularyHead()}},
          .sequenceParallel = sequenceParallel};
}

Tensor wholeLoss(const Tensor& logits, const Tensor& targets) {
  return crossEntropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
}

PipeResult trainOneDevice(int steps) {
  auto model = std::make_shared<UserModel>();
  auto optimizer = pipeOptimizer(model->namedParameters());
  PipeResult result;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = pipeBatch("lm", s, kTokens);
    optimizer->zeroGrad();
    Tensor l = wholeLoss((*model)(x), y);
    l.backward();
    optimizer->step();
    result.losses.push_back(l.item());
  }
  result.state = model->stateDict();
  return result;
}

class UserBlocksThroughAPlan : public ::testing::TestWithParam<bool> {};

TEST_P(UserBlocksThroughAPlan, TrainAsOneDeviceWithAShareOfTheSplitParameters) {
  const bool sequenceParallel = GetParam();
  constexpr int kParts = 2, kSteps = 10;
  const PipeResult want = trainOneDevice(kSteps);
  auto whole = std::make_shared<UserModel>();
  std::map<std::string, int64_t> wholeSizes;
  for (const auto& [name, t] : whole->namedParameters()) wholeSizes[name] = t.numel();
  std::vector<std::vector<double>> losses(kParts);
  auto commFor = nativeRanks(kParts);
  runThreads(kParts, [&](int rank) {
    TensorParallelModel tp(std::make_shared<UserModel>(), commFor(rank), userPlan(sequenceParallel));
    // Every Linear and the embedding split: 1/T of each on this rank, the norms whole.
    int64_t split = 0;
    for (const auto& [name, t] : tp.module().namedParameters()) {
      const bool isSplit = tp.shardSpecs().count(name) > 0;
      EXPECT_EQ(t.numel() * (isSplit ? kParts : 1), wholeSizes.at(name)) << name << ", rank " << rank;
      split += isSplit;
    }
    EXPECT_EQ(split, 1 + 2 * 7 + 1) << "embed, each block's q k v o up (and its bias) down, head (rank "
                                     << rank << ")";
    EXPECT_TRUE(tp.outputSplitByVocabulary());
    auto optimizer = pipeOptimizer(tp.module().namedParameters());
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = pipeBatch("lm", s, kTokens);
      optimizer->zeroGrad();
      Tensor l = tp.loss(tp(x), y);
      l.backward();
      tp.synchronizeGradients();
      optimizer->step();
      losses[static_cast<size_t>(rank)].push_back(l.item());
    }
    tp.gatherInto(rank == 0 ? whole.get() : nullptr, 0);
  });
  EXPECT_EQ(losses[1], losses[0]) << "the ranks computed other losses";
  const double lossDifference = maxRelDiff(losses[0], want.losses);
  const double weightDifference = maxRelDiff(stateValues(whole->stateDict()), stateValues(want.state));
  std::printf("    user blocks, T=2%s: losses %.2g, weights %.2g from one device\n",
              sequenceParallel ? ", sequence-parallel" : "", lossDifference, weightDifference);
  EXPECT_LT(lossDifference, 1e-5);
  EXPECT_LT(weightDifference, 1e-5);
  EXPECT_GT(want.losses[0] - want.losses[8], 0.02) << "the reference does not learn";
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, UserBlocksThroughAPlan, ::testing::Values(false, true));

// Each refusal comes before anything is split, on every rank alike.
void expectRefused(const TensorParallelPlan& plan, int parts, const std::string& expected) {
  auto commFor = nativeRanks(parts);
  runThreads(parts, [&](int rank) {
    try {
      TensorParallelModel tp(std::make_shared<UserModel>(), commFor(rank), plan);
      ADD_FAILURE() << "plan '" << plan.name << "' was accepted on rank " << rank;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  });
}

TEST(TensorParallelPlans, RefusesWhatCannotBeSplitNamingWhy) {
  TensorParallelPlan typo = userPlan();
  typo.styles.emplace_back("*.attn.qq", columnWise());
  expectRefused(typo, 2, "the pattern '*.attn.qq' (column-wise) matches no module of the model");
  // 8 features over 3 ranks; 2 key/value heads of 4 features over 4 ranks (the features
  // would divide, the heads do not).
  TensorParallelPlan features{.name = "features", .styles = {{"*.attn.k", columnWise()}}};
  expectRefused(features, 3,
                "module 'blocks.0.attn.k' (column-wise): output features 8 of its weight [8, 16] "
                "cannot be split over 3 ranks");
  TensorParallelPlan heads{.name = "heads", .styles = {{"*.attn.v", columnWiseHeads(kHeadDim)}}};
  expectRefused(heads, 4,
                "module 'blocks.0.attn.v' (column-wise, heads of 4): output features 8 of its weight "
                "[8, 16] (heads of 4) cannot be split over 4 ranks");
  TensorParallelPlan nothing{.name = "norms only", .styles = {{"*norm*", sequenceNorm()}, {"embed", replicated()}}};
  expectRefused(nothing, 2, "tensor-parallel plan 'norms only' splits no parameter of the model");
  expectRefused({.name = "empty"}, 2, "it has no entries");
  TensorParallelPlan notAttention{.name = "heads", .styles = {{"blocks.0.attn", attentionHeads()}}};
  expectRefused(notAttention, 2, "module 'blocks.0.attn' is neither an nn::CausalSelfAttention nor");
  TensorParallelPlan noWeight{.name = "mlp", .styles = {{"blocks.0.mlp", rowWise()}}};
  expectRefused(noWeight, 2, "module 'blocks.0.mlp' (row-wise) has no 2-d parameter \"weight\"");
}

TEST(TensorParallelPlans, EachModuleTakesTheFirstPatternThatMatchesItsWholePath) {
  // "*" spans dots; "*.attn.*" then keeps k, v and o whole; "attn" alone matches nothing.
  const TensorParallelPlan plan{.name = "stars",
                                .styles = {{"blocks.*.attn.q", columnWise()}, {"*.attn.*", replicated()}}};
  auto one = nativeRanks(1);
  TensorParallelModel tp(std::make_shared<UserModel>(), one(0), plan);
  std::vector<std::pair<std::string, std::string>> want;
  for (const std::string block : {"blocks.0", "blocks.1"}) {
    want.emplace_back(block + ".attn.q", "column-wise");  // a style's name, as the plan prints it
    for (const std::string name : {"k", "v", "o"}) want.emplace_back(block + ".attn." + name, "replicated");
  }
  EXPECT_EQ(tp.splitModules(), want);
  // The default plan knows none of the user's classes: it finds the root's norm alone, and
  // a plan that splits nothing is refused.
  const TensorParallelPlan found = defaultPlan(UserModel());
  ASSERT_EQ(found.styles.size(), 1u);
  EXPECT_EQ(found.styles[0].first, "norm");
  expectRefused(found, 2, "tensor-parallel plan 'default' splits no parameter of the model");
}

// A model that calls its children's forward() directly skips the transforms where the split
// layers communicate: the numbers would be wrong, so the first loss names the module.
TEST(TensorParallelPlans, AModelThatSkipsItsChildrensTransformsIsToldWhy) {
  class DirectCalls : public nn::Module {
   public:
    DirectCalls() {
      Generator gen(3);
      up_ = registerModule("up", std::make_shared<nn::Linear>(kWidth, kHidden, gen));
      down_ = registerModule("down", std::make_shared<nn::Linear>(kHidden, kVocab, gen));
    }
    Tensor forward(const Tensor& x) override { return down_->forward(gelu((*up_)(x))); }

   private:
    std::shared_ptr<nn::Linear> up_, down_;
  };
  const TensorParallelPlan plan{.name = "direct", .styles = {{"up", columnWise()}, {"down", rowWise()}}};
  auto commFor = nativeRanks(2);
  runThreads(2, [&](int rank) {
    TensorParallelModel tp(std::make_shared<DirectCalls>(), commFor(rank), plan);
    Generator gen(4);
    const Tensor x = Tensor::randn({3, kWidth}, gen);
    try {
      tp.loss(tp(x), Tensor::fromVector({3}, std::vector<int64_t>{0, 1, 2}));
      ADD_FAILURE() << "rank " << rank << ": a skipped row-wise layer went unnoticed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("module 'down' was split but no forward reached it through operator()"),
                std::string::npos)
          << e.what();
    }
  });
}

// The engine takes the user's model as it is (not a Sequential: the plan's paths are the
// model's own) and the user's plan, says so, and the start line's figures give each rank's
// share of the model; its state dict has the one-device model's names. A pipeline, which cuts
// a Sequential between its layers, refuses the model by a message that says why.
TEST(TensorParallelPlans, TheEngineSplitsByTheUsersPlanAndCountsTheShare) {
  constexpr int kParts = 2;
  const TensorParallelPlan plan = userPlan();
  auto commFor = nativeRanks(kParts);
  const int64_t whole = UserModel().parameterCount();
  std::vector<std::string> wholeNames;
  for (const auto& [name, t] : UserModel().stateDict()) wholeNames.push_back(name);
  runThreads(kParts, [&](int rank) {
    train::ModelParallelOptions options;
    options.communicator = commFor(rank);
    options.mesh = {.dp = 1, .pp = 1, .tp = kParts};
    options.plan = plan;
    train::ModelParallelEngine engine([] { return std::make_shared<UserModel>(); }, pipeOptimizer, options);
    std::vector<std::string> names;
    for (const auto& [name, t] : engine.stateDict().weights) names.push_back(name);
    if (rank == 0) {
      EXPECT_EQ(names, wholeNames);
    }
    const std::string start = engine.describe().json();
    EXPECT_NE(start.find("\"tp_plan\":\"user\""), std::string::npos) << start;
    EXPECT_NE(start.find("\"rank_share\":\"0.5"), std::string::npos) << start;
    EXPECT_EQ(engine.modelParameterCount(), whole);
    EXPECT_EQ(engine.tensorModel()->plan().name, "user");
    // The norms (4 · 2 · 16 + 2 · 16) and the o and down biases (2 · 2 · 16) stay whole.
    const int64_t replicatedCount = 5 * 2 * kWidth + 2 * 2 * kWidth;
    EXPECT_EQ(engine.parameterCount(), replicatedCount + (whole - replicatedCount) / kParts);
    auto [x, y] = pipeBatch("lm", 0, kTokens);
    EXPECT_TRUE(std::isfinite(engine.step({.inputs = x, .labels = y, .indices = {}}, 0.1)));
  });
  auto pipelineFor = nativeRanks(2);
  runThreads(2, [&](int rank) {
    train::ModelParallelOptions options;
    options.communicator = pipelineFor(rank);
    options.mesh = {.dp = 1, .pp = 2, .tp = 1};
    options.splitAt = {1};
    try {
      train::ModelParallelEngine engine([] { return std::make_shared<UserModel>(); }, pipeOptimizer, options);
      ADD_FAILURE() << "rank " << rank << ": a pipeline took a model that is not a Sequential";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("2 pipeline stages cut an nn::Sequential between its layers, and the "
                                           "model factory built another module"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace kolo::parallel
