// Tests of gradients written straight into a leaf's buffer (linear/matmul weight gradients)
// and of zeroGrad's logical zeros: values against closed forms, storage kept, hooks once.
#include <gtest/gtest.h>

#include "kolo/ops.h"

namespace kolo {
namespace {

// d/dW sum(x W^T) = ones^T x: column j of x summed over rows, for every output row.
std::vector<float> expectedLinearWeightGrad(const std::vector<float>& x, int64_t rows, int64_t in, int64_t out,
                                            float times) {
  std::vector<float> g(static_cast<size_t>(out * in), 0.0f);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < in; ++i) g[o * in + i] += times * x[r * in + i];
  return g;
}

TEST(DirectGrad, LinearWeightGradientOverwritesAfterZeroGradAndAccumulatesOtherwise) {
  const std::vector<float> xv{1, 2, 3, -1, 0.5f, 4};
  Tensor x = Tensor::fromVector({2, 3}, xv);
  Generator gen(3);
  Tensor w = Tensor::randn({4, 3}, gen).setRequiresGrad();
  int fired = 0;
  w.addGradReadyHook([&](Tensor&) { ++fired; });
  sum(linear(x, w, Tensor())).backward();
  const Tensor first = w.grad();
  const void* storage = first.data<float>();
  EXPECT_EQ(w.grad().toFloatVector(), expectedLinearWeightGrad(xv, 2, 3, 4, 1.0f));
  sum(linear(x, w, Tensor())).backward();  // no zeroGrad: accumulates
  EXPECT_EQ(w.grad().toFloatVector(), expectedLinearWeightGrad(xv, 2, 3, 4, 2.0f));
  w.zeroGrad();
  sum(linear(x, w, Tensor())).backward();  // after zeroGrad: the old values are gone
  EXPECT_EQ(w.grad().toFloatVector(), expectedLinearWeightGrad(xv, 2, 3, 4, 1.0f));
  EXPECT_EQ(w.grad().data<float>(), storage);
  EXPECT_EQ(fired, 3);
}

TEST(DirectGrad, ZeroGradReadsAsZerosAndKeepsAViewedBuffer) {
  Tensor w = Tensor::fromVector({2, 2}, std::vector<float>{1, 2, 3, 4}).setRequiresGrad();
  Tensor bucket = Tensor::fromVector({6}, std::vector<float>{9, 9, 9, 9, 9, 9});
  w.setGrad(bucket.slice(0, 1, 5).view({2, 2}));
  w.zeroGrad();
  EXPECT_EQ(w.grad().toFloatVector(), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(bucket.toFloatVector(), (std::vector<float>{9, 0, 0, 0, 0, 9}));
  // A gradient written after zeroGrad lands in the viewed buffer.
  w.zeroGrad();
  Tensor a = Tensor::fromVector({1, 2}, std::vector<float>{1, 2});
  sum(matmul(a, w)).backward();  // d/dw sum(a w) = a^T ones
  EXPECT_EQ(bucket.toFloatVector(), (std::vector<float>{9, 1, 1, 2, 2, 9}));
}

TEST(DirectGrad, SharedWeightSumsBothUses) {
  const std::vector<float> xv{1, 2, 3, 4};
  Tensor x = Tensor::fromVector({2, 2}, xv);
  Tensor w = Tensor::fromVector({2, 2}, std::vector<float>{1, 0, 0, 1}).setRequiresGrad();
  int fired = 0;
  w.addGradReadyHook([&](Tensor&) { ++fired; });
  for (int pass = 0; pass < 2; ++pass) {
    w.zeroGrad();
    // Two uses of w: the weight gradient is the sum of both contributions.
    sum(add(linear(x, w, Tensor()), linear(x, w, Tensor()))).backward();
    EXPECT_EQ(w.grad().toFloatVector(), expectedLinearWeightGrad(xv, 2, 2, 2, 2.0f));
  }
  EXPECT_EQ(fired, 2);
}

TEST(DirectGrad, ZeroGradOfAParameterWithoutGradientStaysZero) {
  Tensor w = Tensor::fromVector({2}, std::vector<float>{1, 2}).setRequiresGrad();
  Tensor u = Tensor::fromVector({2}, std::vector<float>{3, 4}).setRequiresGrad();
  sum(mul(w, u)).backward();
  w.zeroGrad();
  u.zeroGrad();
  sum(w).backward();  // u gets nothing this pass
  EXPECT_EQ(w.grad().toFloatVector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(u.grad().toFloatVector(), (std::vector<float>{0, 0}));
}

}  // namespace
}  // namespace kolo
