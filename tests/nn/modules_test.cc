// Tests of nn modules: PyTorch state_dict names and shapes of the built-in models, default
// initialisation bounds, modes, finite-difference checks of every module in f64, and the
// causality of self-attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "kolo/nn/nn.h"

namespace kolo {
namespace {

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [n, t] : m.namedParameters()) out.push_back(n);
  return out;
}

TEST(Models, NamesAndShapesEqualPyTorchStateDict) {
  Generator gen(0);
  auto mlp = nn::makeModel("mlp", gen);
  EXPECT_EQ(names(*mlp), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  EXPECT_EQ(mlp->namedParameters()[0].second.shape(), (Shape{512, 784}));
  EXPECT_EQ(mlp->parameterCount(), 535818);
  auto cnn = nn::makeModel("cnn", gen);
  EXPECT_EQ(names(*cnn), (std::vector<std::string>{"1.weight", "1.bias", "4.weight", "4.bias", "8.weight", "8.bias",
                                                   "10.weight", "10.bias"}));
  EXPECT_EQ(cnn->namedParameters()[2].second.shape(), (Shape{64, 32, 5, 5}));
  EXPECT_EQ(cnn->parameterCount(), 184586);
  EXPECT_EQ(cnn->forward(Tensor::zeros({3, 784})).shape(), (Shape{3, 10}));
  EXPECT_THROW(nn::makeModel("vgg", gen), InvalidArgument);
  for (auto& p : cnn->parameters()) EXPECT_TRUE(p.requiresGrad());
}

// The llama lm's head is its embedding's table: one parameter (listed once, trained once),
// two state-dict names, loadable from a file that holds either.
TEST(Models, TiedEmbeddingsAreOneParameterUnderTwoStateDictNames) {
  Generator gen(0);
  const nn::LanguageModelConfig sizes{.layers = 1, .dModel = 32, .heads = 4, .seqLen = 8,
                                      .arch = nn::LanguageModelArch::Llama, .kvHeads = 1};
  auto lm = nn::makeLanguageModel(sizes, gen);
  const std::vector<std::string> listed = names(*lm);
  EXPECT_EQ(std::count(listed.begin(), listed.end(), "0.weight"), 1);
  EXPECT_EQ(std::count(listed.begin(), listed.end(), "3.weight"), 0);
  // 1 block: norms 2 x 32, q 32x32, k and v 32x8 each, o 32x32, SwiGLU 3 x 32x64; final norm.
  EXPECT_EQ(lm->parameterCount(), 256 * 32 + 64 + 1024 + 512 + 1024 + 3 * 2048 + 32);
  int64_t inState = 0;
  for (const auto& [name, t] : lm->stateDict()) inState += name == "0.weight" || name == "3.weight";
  EXPECT_EQ(inState, 2);
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto& [name, t] : lm->stateDict())
    if (name != "3.weight") state.emplace_back(name, name == "0.weight" ? Tensor::ones(t.shape()) : t.clone());
  lm->loadStateDict(state, "a file with one name of the table");
  EXPECT_EQ(lm->stateDict().back().second.toDoubleVector()[0], 1.0) << "the head does not read the loaded table";
  const Tensor logits = lm->forward(Tensor::fromVector({1, 3}, std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(logits.shape(), (Shape{1, 3, 256}));
}

// A model's author getting a size or a name wrong gets InvalidArgument naming it, not a
// failed internal check ("check failed: ... (file:line)", InternalError).
TEST(Modules, AnAuthorsMistakesAreUsageErrors) {
  Generator gen(0);
  const auto usage = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const InternalError& e) {
      return std::string("internal: ") + e.what();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const auto expectUsage = [&](const std::function<void()>& fn, const std::string& says) {
    const std::string message = usage(fn);
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_EQ(message.rfind("internal", 0), std::string::npos) << message;
  };
  expectUsage([&] { nn::Linear(0, 3, gen); }, "Linear(0, 3): sizes must be positive");
  expectUsage([&] { nn::CausalSelfAttention(10, 3, gen); }, "CausalSelfAttention");
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(2, 2, gen));
  expectUsage([&] { model.add(nullptr); }, "registerModule('1') with a null module");
}

TEST(Init, DefaultBoundsFollowPyTorch) {
  Generator gen(1);
  nn::Linear lin(100, 50, gen);
  double maxAbs = 0;
  for (float v : lin.weight.toFloatVector()) maxAbs = std::max(maxAbs, std::abs(double(v)));
  EXPECT_LE(maxAbs, 0.1);
  EXPECT_GT(maxAbs, 0.09);  // 5000 draws from U(-0.1, 0.1) come close to the bound
  nn::Conv2d conv(4, 8, 3, gen);
  for (float v : conv.bias.toFloatVector()) EXPECT_LE(std::abs(v), 1.0 / 6.0);
  nn::LayerNorm ln({6});
  EXPECT_EQ(ln.weight.toFloatVector(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(ln.bias.toFloatVector(), std::vector<float>(6, 0.0f));
  // Same seed, same weights.
  Generator g1(7), g2(7);
  EXPECT_EQ(nn::makeModel("mlp", g1)->parameters()[2].toFloatVector(),
            nn::makeModel("mlp", g2)->parameters()[2].toFloatVector());
}

TEST(Modes, DropoutOnlyInTraining) {
  nn::Sequential seq{std::make_shared<nn::Dropout>(0.5, 3)};
  Tensor x = Tensor::ones({100});
  seq.train(false);
  EXPECT_FALSE(seq.at(0).isTraining());
  EXPECT_EQ(seq.forward(x).toFloatVector(), x.toFloatVector());
  seq.train(true);
  int zeros = 0;
  for (float v : seq.forward(x).toFloatVector()) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f);
    zeros += v == 0.0f;
  }
  EXPECT_GT(zeros, 20);
  EXPECT_LT(zeros, 80);
}

// Gradient check of a module in f64 with respect to its input (when floating) and every parameter.
void checkModule(nn::Module& m, Tensor input, bool inputGrad = true) {
  m.castParameters(DType::F64);
  std::vector<Tensor> leaves;
  if (inputGrad) {
    input = input.to(DType::F64).clone();
    input.setRequiresGrad(true);
    leaves.push_back(input);
  }
  for (auto& p : m.parameters()) leaves.push_back(p);
  Tensor fixedInput = input;
  testing::gradcheck([&](const std::vector<Tensor>&) { return m.forward(fixedInput); }, leaves);
}

TEST(ModuleGradcheck, EveryModule) {
  Generator gen(5);
  {
    nn::Linear m(4, 3, gen);
    checkModule(m, Tensor::randn({2, 4}, gen));
  }
  {
    nn::Conv2d m(2, 3, 3, gen, 1, 1);
    checkModule(m, Tensor::randn({2, 2, 4, 4}, gen));
  }
  {
    nn::LayerNorm m({5});
    checkModule(m, Tensor::randn({3, 5}, gen));
  }
  {
    nn::Embedding m(6, 3, gen);
    checkModule(m, Tensor::fromVector({4}, std::vector<int64_t>{5, 0, 5, 2}), false);
  }
  {
    nn::Sequential m{std::make_shared<nn::Unflatten>(1, Shape{1, 4, 4}), std::make_shared<nn::Conv2d>(1, 2, 3, gen),
                     std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
                     std::make_shared<nn::Linear>(2, 3, gen), std::make_shared<nn::Tanh>(),
                     std::make_shared<nn::GELU>()};
    checkModule(m, Tensor::randn({2, 16}, gen));
  }
  {
    nn::CausalSelfAttention m(4, 2, gen);
    checkModule(m, Tensor::randn({2, 3, 4}, gen));
  }
  {
    nn::TransformerBlock m(4, 2, gen, 8);
    checkModule(m, Tensor::randn({1, 3, 4}, gen));
  }
}

TEST(Attention, OutputAtTDependsOnlyOnPositionsUpToT) {
  Generator gen(9);
  nn::CausalSelfAttention attn(8, 2, gen);
  Tensor x = Tensor::randn({1, 5, 8}, gen);
  std::vector<float> before = attn.forward(x).toFloatVector();
  // Change the last position: outputs at positions 0..3 must not move.
  Tensor changed = x.clone();
  changed.slice(1, 4, 5).fill(3.0);
  std::vector<float> after = attn.forward(changed).toFloatVector();
  for (int i = 0; i < 4 * 8; ++i) EXPECT_EQ(before[i], after[i]) << i;
  bool lastMoved = false;
  for (int i = 4 * 8; i < 5 * 8; ++i) lastMoved |= before[i] != after[i];
  EXPECT_TRUE(lastMoved);
  nn::TransformerBlock block(8, 2, gen);
  EXPECT_EQ(names(block).front(), "ln1.weight");
  EXPECT_EQ(names(block)[2], "attn.qkv.weight");
  EXPECT_EQ(names(block).back(), "mlp.2.bias");
  EXPECT_EQ(block.forward(x).shape(), (Shape{1, 5, 8}));
}

// maxRelativeDifference over two modules' tensors: 0 for equal weights, the largest
// per-tensor max |a - b| / max |b| after a change, and a usage error naming the tensor when
// the architectures differ.
TEST(Module, MaxRelativeDifferenceOfTwoModules) {
  Generator gen(3), same(3), other(4);
  nn::Linear a(4, 3, gen), b(4, 3, same), wider(5, 3, other);
  EXPECT_EQ(nn::maxRelativeDifference(a, b), 0.0);
  b.weight.data<float>()[0] += 0.5f;
  double scale = 0.0;
  for (float v : b.weight.toFloatVector()) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  EXPECT_NEAR(nn::maxRelativeDifference(a, b), 0.5 / scale, 1e-6);
  try {
    nn::maxRelativeDifference(a, wider);
    ADD_FAILURE() << "no error for another architecture";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'weight' [3, 4] against 'weight' [3, 5]"), std::string::npos) << e.what();
  }
}

// A block's children run through operator(), as a PyTorch module's submodule calls do: the
// forward hooks on ln1, attn (after its qkv and proj), ln2 and the mlp's children fire once per
// forward, in that order, each with the child's (B, T, .) output. (mlp.0 and the GELU run as
// one op only while neither they nor the mlp has a hook.)
TEST(Attention, TransformerBlockFiresItsChildrensHooks) {
  Generator gen(4);
  nn::TransformerBlock block(8, 2, gen);
  std::vector<std::string> fired;
  for (auto& [name, module] : block.namedModules()) {
    if (name.empty()) continue;
    module->addForwardHook([&fired, name](nn::Module&, const Tensor& out) {
      EXPECT_EQ(out.shape().front(), 2) << name;
      fired.push_back(name);
    });
  }
  const Tensor x = Tensor::randn({2, 5, 8}, gen);
  block(x);
  const std::vector<std::string> order = {"ln1",   "attn.qkv", "attn.proj", "attn", "ln2",
                                          "mlp.0", "mlp.1",    "mlp.2",     "mlp"};
  EXPECT_EQ(fired, order);
  fired.clear();
  block(x, Tensor::ones({5, 5}));
  EXPECT_EQ(fired, order);
}

}  // namespace
}  // namespace kolo
