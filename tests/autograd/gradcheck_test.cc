// Finite-difference gradient checks (f64) for every differentiable op in kolo/ops.h and
// every differentiable Tensor view.
#include <array>
#include <optional>

#include "autograd/gradcheck.h"

namespace kolo {
namespace {

using testing::gradcheck;
using testing::leaf;
using V = std::vector<Tensor>;

TEST(Gradcheck, BroadcastingArithmetic) {
  gradcheck([](const V& x) { return add(x[0], x[1]); }, {leaf({3, 4}, 1), leaf({4}, 2)});
  gradcheck([](const V& x) { return sub(x[0], x[1]); }, {leaf({3, 1}, 3), leaf({1, 4}, 4)});
  gradcheck([](const V& x) { return mul(x[0], x[1]); }, {leaf({2, 3, 4}, 5), leaf({3, 1}, 6)});
  gradcheck([](const V& x) { return div(x[0], x[1]); }, {leaf({3, 4}, 7), leaf({3, 4}, 8, 0.5, 2.0)});
  gradcheck([](const V& x) { return maximum(x[0], x[1]); }, {leaf({3, 4}, 9), leaf({4}, 10)});
  gradcheck([](const V& x) { return minimum(x[0], x[1]); }, {leaf({3, 4}, 11), leaf({3, 4}, 12)});
  gradcheck([](const V& x) { return x[0] * 3.0 - 1.0 + 2.0 / x[1]; }, {leaf({5}, 13), leaf({5}, 14, 1.0, 2.0)});
  gradcheck([](const V& x) { return -x[0]; }, {leaf({5}, 15)});
}

TEST(Gradcheck, ElementwiseFunctions) {
  gradcheck([](const V& x) { return exp(x[0]); }, {leaf({6}, 1)});
  gradcheck([](const V& x) { return log(x[0]); }, {leaf({6}, 2, 0.5, 2.0)});
  gradcheck([](const V& x) { return sqrt(x[0]); }, {leaf({6}, 3, 0.5, 2.0)});
  gradcheck([](const V& x) { return tanh(x[0]); }, {leaf({6}, 4)});
  gradcheck([](const V& x) { return sigmoid(x[0]); }, {leaf({6}, 5)});
  gradcheck([](const V& x) { return relu(x[0]); }, {leaf({20}, 6)});
  gradcheck([](const V& x) { return gelu(x[0]); }, {leaf({20}, 7, -3.0, 3.0)});
  gradcheck([](const V& x) { return pow(x[0], 3.0); }, {leaf({6}, 8)});
  gradcheck([](const V& x) { return pow(x[0], 0.5); }, {leaf({6}, 9, 0.5, 2.0)});
}

TEST(Gradcheck, Reductions) {
  gradcheck([](const V& x) { return sum(x[0]); }, {leaf({3, 4}, 1)});
  gradcheck([](const V& x) { return sum(x[0], {1}, false); }, {leaf({3, 4, 2}, 2)});
  gradcheck([](const V& x) { return sum(x[0], {0, 2}, true); }, {leaf({3, 4, 2}, 3)});
  gradcheck([](const V& x) { return mean(x[0]); }, {leaf({3, 4}, 4)});
  gradcheck([](const V& x) { return mean(x[0], {-1}, true); }, {leaf({3, 4}, 5)});
  gradcheck([](const V& x) { return max(x[0], 1, false); }, {leaf({3, 5}, 6)});
  gradcheck([](const V& x) { return max(x[0], 0, true); }, {leaf({3, 5}, 7)});
  gradcheck([](const V& x) { return max(x[0]); }, {leaf({3, 5}, 8)});
}

TEST(Gradcheck, MatrixProducts) {
  gradcheck([](const V& x) { return matmul(x[0], x[1]); }, {leaf({3, 4}, 1), leaf({4, 5}, 2)});
  gradcheck([](const V& x) { return matmul(x[0].t(), x[1].t()); }, {leaf({4, 3}, 3), leaf({5, 4}, 4)});
  gradcheck([](const V& x) { return matmul(x[0], x[1]); }, {leaf({2, 3, 4}, 5), leaf({4, 2}, 6)});
  gradcheck([](const V& x) { return matmul(x[0], x[1]); }, {leaf({2, 3, 4}, 7), leaf({1, 4, 2}, 8)});
  gradcheck([](const V& x) { return matmul(x[0], x[1]); }, {leaf({4}, 9), leaf({4, 3}, 10)});
  gradcheck([](const V& x) { return bmm(x[0], x[1]); }, {leaf({2, 3, 4}, 11), leaf({2, 4, 5}, 12)});
  gradcheck([](const V& x) { return linear(x[0], x[1], x[2]); }, {leaf({5, 4}, 13), leaf({3, 4}, 14), leaf({3}, 15)});
  gradcheck([](const V& x) { return linear(x[0], x[1], Tensor()); }, {leaf({2, 5, 4}, 16), leaf({3, 4}, 17)});
}

TEST(Gradcheck, NeuralNetworkFunctions) {
  gradcheck([](const V& x) { return softmax(x[0], 1); }, {leaf({3, 5}, 1)});
  gradcheck([](const V& x) { return softmax(x[0], 0); }, {leaf({3, 5}, 2)});
  gradcheck([](const V& x) { return logSoftmax(x[0], -1); }, {leaf({3, 5}, 3)});
  Tensor labels = Tensor::fromVector({4}, std::vector<int64_t>{0, 2, 1, 2});
  gradcheck([&](const V& x) { return crossEntropy(x[0], labels); }, {leaf({4, 3}, 4)});
  gradcheck([](const V& x) { return conv2d(x[0], x[1], x[2]); },
            {leaf({2, 2, 5, 5}, 5), leaf({3, 2, 3, 3}, 6), leaf({3}, 7)});
  gradcheck([](const V& x) { return conv2d(x[0], x[1], x[2], 2, 1); },
            {leaf({1, 2, 6, 5}, 8), leaf({2, 2, 3, 3}, 9), leaf({2}, 10)});
  gradcheck([](const V& x) { return maxPool2d(x[0], 2); }, {leaf({2, 2, 4, 6}, 11)});
  gradcheck([](const V& x) { return maxPool2d(x[0], 3, 2, 1); }, {leaf({1, 2, 5, 5}, 12)});
  gradcheck([](const V& x) { return layerNorm(x[0], {4}, x[1], x[2]); }, {leaf({3, 4}, 13), leaf({4}, 14), leaf({4}, 15)});
  gradcheck([](const V& x) { return layerNorm(x[0], {2, 3}, Tensor(), Tensor()); }, {leaf({2, 2, 3}, 16)});
  Tensor ids = Tensor::fromVector({2, 3}, std::vector<int64_t>{0, 3, 3, 1, 0, 2});
  gradcheck([&](const V& x) { return embedding(ids, x[0]); }, {leaf({4, 5}, 17)});
  Generator gen(3);
  Tensor x = leaf({50}, 18);
  Tensor y = dropout(x, 0.5, true, gen);
  sum(y).backward();
  // Each gradient entry is 0 (dropped) or 2 (kept, scaled by 1/(1-p)) and matches the output.
  std::vector<double> g = x.grad().toDoubleVector(), yv = y.toDoubleVector(), xv = x.toDoubleVector();
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(g[i] == 0.0 || g[i] == 2.0);
    EXPECT_DOUBLE_EQ(yv[i], xv[i] * g[i]);
  }
}

TEST(Gradcheck, FusedCausalAttention) {
  // qkv (B 2, T 5, 3C with C 6) over 1, 2 and 3 heads (hd 6, 3, 2).
  for (int64_t heads : {1, 2, 3})
    gradcheck([heads](const V& x) { return causalAttention(x[0], heads); }, {leaf({2, 5, 18}, 20 + heads)});
  // T 37: two row blocks of the kernel, the second one partial.
  gradcheck([](const V& x) { return causalAttention(x[0], 2); }, {leaf({1, 37, 12}, 24)});
}

TEST(Gradcheck, GroupedQueryAttentionWithRotaryPositions) {
  // q (B 2, T 5, Hq*d), k and v (B, T, Hkv*d): multi-head, grouped (3 query heads per key/value
  // head) and multi-query, with and without rotation, a position offset, odd widths.
  const Rotary rope{.theta = 100.0, .offset = 3};
  for (const auto& [hq, hkv, d] : std::vector<std::array<int64_t, 3>>{{2, 2, 2}, {6, 2, 4}, {3, 1, 6}})
    for (const std::optional<Rotary> rotary : {std::optional<Rotary>(), std::optional<Rotary>(rope)})
      gradcheck([d, rotary](const V& x) { return causalAttention(x[0], x[1], x[2], d, rotary); },
                {leaf({2, 5, hq * d}, 40 + hq), leaf({2, 5, hkv * d}, 50 + hkv), leaf({2, 5, hkv * d}, 60 + d)});
  // T 37: two row blocks of the kernel, the second one partial; P recomputed (2*37 > 4+2+2 widths).
  gradcheck([](const V& x) { return causalAttention(x[0], x[1], x[2], 2, Rotary{}); },
            {leaf({1, 37, 4}, 70), leaf({1, 37, 2}, 71), leaf({1, 37, 2}, 72)});
}

TEST(Gradcheck, LlamaBlockFunctions) {
  gradcheck([](const V& x) { return rmsNorm(x[0], x[1]); }, {leaf({3, 5, 7}, 80), leaf({7}, 81)});
  gradcheck([](const V& x) { return rmsNorm(x[0], Tensor(), 1e-3); }, {leaf({4, 33}, 82)});
  gradcheck([](const V& x) { return silu(x[0]); }, {leaf({4, 9}, 83, -4.0, 4.0)});
  gradcheck([](const V& x) { return swiglu(x[0], x[1]); }, {leaf({3, 7}, 84, -4.0, 4.0), leaf({3, 7}, 85)});
  gradcheck([](const V& x) { return rotaryEmbedding(x[0], 6, Rotary{.theta = 50.0, .offset = 2}); },
            {leaf({2, 4, 12}, 86)});
}

TEST(Gradcheck, JoinSelectAndViews) {
  gradcheck([](const V& x) { return cat({x[0], x[1]}, 1); }, {leaf({2, 3}, 1), leaf({2, 2}, 2)});
  gradcheck([](const V& x) { return stack({x[0], x[1]}, 0); }, {leaf({2, 3}, 3), leaf({2, 3}, 4)});
  Tensor cond = Tensor::fromVector({2, 3}, std::vector<int64_t>{1, 0, 1, 0, 0, 1});
  gradcheck([&](const V& x) { return where(cond, x[0], x[1]); }, {leaf({2, 3}, 5), leaf({3}, 6)});
  gradcheck([](const V& x) { return maskedFill(x[0], trilMask(3), -5.0); }, {leaf({3, 3}, 7)});
  gradcheck([](const V& x) { return x[0].reshape({3, 4}) * x[1]; }, {leaf({2, 6}, 8), leaf({4}, 9)});
  gradcheck([](const V& x) { return x[0].transpose(0, 2).permute({1, 0, 2}); }, {leaf({2, 3, 4}, 10)});
  gradcheck([](const V& x) { return x[0].slice(1, 1, 4, 2); }, {leaf({2, 5}, 11)});
  gradcheck([](const V& x) { return x[0].expand({3, 2, 4}); }, {leaf({2, 1}, 12)});
  gradcheck([](const V& x) { return x[0].unsqueeze(1).squeeze(1).flatten(); }, {leaf({2, 3}, 13)});
  gradcheck([](const V& x) { return x[0].view({6}); }, {leaf({2, 3}, 14)});
}

}  // namespace
}  // namespace kolo
