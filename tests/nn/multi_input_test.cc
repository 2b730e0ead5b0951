// Tests of modules with several inputs: Module::forward over a vector and model(x, mask),
// the attention mask of CausalSelfAttention against the causal path and a result computed
// by hand from the weights, and the fused causal path against the separate ops.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/gradcheck.h"
#include "kolo/nn/nn.h"

namespace kolo {
namespace {

Tensor parameter(const nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.namedParameters())
    if (n == name) return t;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

// The causal path alone is the fused blocked attention (online softmax); a mask goes through
// the separate ops, which round differently: equal to float tolerance, not bit for bit.
TEST(MultiInput, AllowingEveryKeyIsTheCausalPath) {
  Generator gen(11);
  nn::CausalSelfAttention attn(8, 2, gen);
  Tensor x = Tensor::randn({2, 5, 8}, gen);
  const std::vector<float> causal = attn.forward(x).toFloatVector();
  auto expectCausal = [&](const Tensor& y, const std::string& what) {
    const std::vector<float> v = y.toFloatVector();
    ASSERT_EQ(v.size(), causal.size()) << what;
    for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], causal[i], 1e-6) << what << " element " << i;
  };
  for (const Shape& shape : {Shape{5, 5}, Shape{2, 5, 5}, Shape{2, 2, 5, 5}}) {
    Tensor ones = Tensor::ones(shape, DType::U8);
    expectCausal(attn.forward(x, ones), shapeString(shape));
    expectCausal(attn(x, ones), shapeString(shape));
    expectCausal(attn.forward(std::vector<Tensor>{x, ones}), shapeString(shape));
  }
  EXPECT_EQ(attn.forward(x, Tensor()).toFloatVector(), causal);
  EXPECT_EQ(attn.forward(std::vector<Tensor>{x}).toFloatVector(), causal);
}

// With only the diagonal allowed, each position attends to itself alone (weight 1), so
// y_t = proj(v_t) with v_t = Wv x_t + bv: computed here in double from the weights.
TEST(MultiInput, DiagonalMaskGivesTheProjectedValues) {
  Generator gen(12);
  const int64_t c = 6, t = 4;
  nn::CausalSelfAttention attn(c, 3, gen);
  Tensor x = Tensor::randn({1, t, c}, gen);
  Tensor eye = Tensor::zeros({t, t}, DType::U8);
  for (int64_t i = 0; i < t; ++i) eye.data<uint8_t>()[i * t + i] = 1;
  const std::vector<float> y = attn.forward(x, eye).toFloatVector();

  const std::vector<double> xs = x.toDoubleVector();
  const std::vector<double> wqkv = parameter(attn, "qkv.weight").toDoubleVector();  // (3C, C)
  const std::vector<double> bqkv = parameter(attn, "qkv.bias").toDoubleVector();
  const std::vector<double> wp = parameter(attn, "proj.weight").toDoubleVector();  // (C, C)
  const std::vector<double> bp = parameter(attn, "proj.bias").toDoubleVector();
  for (int64_t pos = 0; pos < t; ++pos) {
    std::vector<double> v(c);
    for (int64_t o = 0; o < c; ++o) {
      v[o] = bqkv[2 * c + o];
      for (int64_t i = 0; i < c; ++i) v[o] += wqkv[(2 * c + o) * c + i] * xs[pos * c + i];
    }
    for (int64_t o = 0; o < c; ++o) {
      double expected = bp[o];
      for (int64_t i = 0; i < c; ++i) expected += wp[o * c + i] * v[i];
      EXPECT_NEAR(y[pos * c + o], expected, 1e-5) << "position " << pos << " channel " << o;
    }
  }
}

// Without a mask the attention is one fused op (causalAttention); with a mask of all ones it
// takes the separate ops (head transposes, matmul, where, softmax). Both must give the same
// output and the same gradients of the input and of every parameter, in f32.
TEST(MultiInput, FusedCausalAttentionEqualsTheSeparateOps) {
  Generator gen(11);
  const int64_t b = 2, t = 70, c = 12;  // T 70: row blocks of 32, 32 and 6
  nn::CausalSelfAttention attn(c, 4, gen);
  const Tensor x0 = Tensor::randn({b, t, c}, gen);
  auto run = [&](bool fused, std::vector<std::vector<float>>* grads) {
    attn.zeroGrad();
    Tensor x = x0.clone();
    x.setRequiresGrad(true);
    Tensor y = fused ? attn.forward(x) : attn.forward(x, Tensor::ones({t, t}, DType::U8));
    Generator weights(5);
    sum(y * Tensor::randn(y.shape(), weights)).backward();
    grads->push_back(x.grad().toFloatVector());
    for (auto& [name, p] : attn.namedParameters()) grads->push_back(p.grad().toFloatVector());
    return y.toFloatVector();
  };
  std::vector<std::vector<float>> fusedGrads, separateGrads;
  const std::vector<float> fused = run(true, &fusedGrads), separate = run(false, &separateGrads);
  ASSERT_EQ(fused.size(), separate.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_NEAR(fused[i], separate[i], 1e-5) << "output " << i;
  ASSERT_EQ(fusedGrads.size(), separateGrads.size());
  for (size_t g = 0; g < fusedGrads.size(); ++g)
    for (size_t i = 0; i < fusedGrads[g].size(); ++i)
      EXPECT_NEAR(fusedGrads[g][i], separateGrads[g][i], 1e-5) << "gradient " << g << " element " << i;
}

// A per-sample mask: in sample 1 no position after 0 may look at position 0, so changing
// x at position 0 of sample 1 moves only output 0 there; without the mask it moves all.
TEST(MultiInput, MaskedKeysDoNotInfluenceTheOutput) {
  Generator gen(13);
  nn::CausalSelfAttention attn(4, 2, gen);
  const int64_t t = 4, c = 4;
  Tensor x = Tensor::randn({2, t, c}, gen);
  Tensor mask = Tensor::ones({2, t, t}, DType::U8);
  for (int64_t q = 1; q < t; ++q) mask.data<uint8_t>()[t * t + q * t] = 0;  // sample 1, key 0
  Tensor changed = x.clone();
  changed.slice(0, 1, 2).slice(1, 0, 1).fill(2.5);

  const std::vector<float> before = attn.forward(x, mask).toFloatVector();
  const std::vector<float> after = attn.forward(changed, mask).toFloatVector();
  for (int64_t i = 0; i < t * c; ++i) EXPECT_EQ(before[i], after[i]) << "sample 0, element " << i;
  bool firstMoved = false;
  for (int64_t i = 0; i < c; ++i) firstMoved |= before[t * c + i] != after[t * c + i];
  EXPECT_TRUE(firstMoved);
  for (int64_t i = c; i < t * c; ++i)
    EXPECT_EQ(before[t * c + i], after[t * c + i]) << "sample 1, element " << i;

  const std::vector<float> causalBefore = attn.forward(x).toFloatVector();
  const std::vector<float> causalAfter = attn.forward(changed).toFloatVector();
  EXPECT_NE(causalBefore[t * c + c], causalAfter[t * c + c]);
}

TEST(MultiInput, MaskedAttentionGradcheck) {
  Generator gen(14);
  nn::CausalSelfAttention m(4, 2, gen);
  m.castParameters(DType::F64);
  Tensor x = Tensor::randn({2, 3, 4}, gen).to(DType::F64).clone();
  x.setRequiresGrad(true);
  Tensor mask = Tensor::ones({2, 3, 3}, DType::U8);
  mask.data<uint8_t>()[9 + 2 * 3 + 0] = 0;  // sample 1: position 2 does not see position 0
  std::vector<Tensor> leaves{x};
  for (auto& p : m.parameters()) leaves.push_back(p);
  testing::gradcheck([&](const std::vector<Tensor>&) { return m(x, mask); }, leaves);
}

TEST(MultiInput, BlockAndSequentialPassTheMaskToAttention) {
  Generator gen(15);
  auto block = std::make_shared<nn::TransformerBlock>(8, 2, gen);
  nn::Sequential seq{block, std::make_shared<nn::Linear>(8, 3, gen)};
  Tensor x = Tensor::randn({1, 4, 8}, gen);
  Tensor eye = Tensor::zeros({4, 4}, DType::U8);
  for (int64_t i = 0; i < 4; ++i) eye.data<uint8_t>()[i * 4 + i] = 1;
  const std::vector<float> masked = seq(x, eye).toFloatVector();
  Tensor h = block->forward(x, eye);
  EXPECT_EQ(masked, seq.at(1).forward(h).toFloatVector());
  EXPECT_NE(masked, seq.forward(x).toFloatVector());
  EXPECT_EQ(seq.forward(std::vector<Tensor>{x}).toFloatVector(), seq.forward(x).toFloatVector());
}

TEST(MultiInput, WrongCountsAndShapesAreRefused) {
  Generator gen(16);
  nn::CausalSelfAttention attn(4, 2, gen);
  Tensor x = Tensor::randn({2, 3, 4}, gen);
  EXPECT_THROW(attn.forward(x, Tensor::ones({3, 4}, DType::U8)), InvalidArgument);
  EXPECT_THROW(attn.forward(x, Tensor::ones({3, 3, 3}, DType::U8)), InvalidArgument);
  EXPECT_THROW(attn.forward(x, Tensor::ones({2, 3, 3, 3}, DType::U8)), InvalidArgument);
  EXPECT_THROW(attn(x, x, x), InvalidArgument);
  nn::Linear lin(4, 2, gen);
  nn::Module& plain = lin;
  EXPECT_THROW(plain(x, x), InvalidArgument);
  EXPECT_THROW(plain.forward(std::vector<Tensor>{}), InvalidArgument);
  EXPECT_EQ(plain.forward(std::vector<Tensor>{x}).toFloatVector(), lin.forward(x).toFloatVector());
}

}  // namespace
}  // namespace kolo
