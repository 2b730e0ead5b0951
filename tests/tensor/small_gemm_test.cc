// The small-dimension GEMM kernels against a double-precision sum by definition, over the
// tile remainders (rows 1..7, columns around multiples of 16 and 64), leading dimensions
// wider than the matrix, alpha/beta, a NaN in a C that beta = 0 must not read, and the
// calls the kernels must leave to OpenBLAS; transformer shapes in blocks of rows and chunks
// of the inner dimension, and their forward with the weight copied transposed, also with
// a linear layer's bias and GELU in the store (smallLinear).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tensor/small_gemm.h"

namespace kolo::detail {
namespace {

struct Operand {
  std::vector<float> data;
  int64_t ld;
};

// A rows x cols row-major matrix with `pad` unused columns after each row.
Operand randomMatrix(int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Operand m{std::vector<float>(static_cast<size_t>(rows * (cols + pad))), cols + pad};
  for (float& x : m.data) x = dist(rng);
  return m;
}

bool supported() {
  // A 1x1x1 product no build of the kernels refuses unless the CPU lacks AVX-512.
  float a = 1.0f, b = 2.0f, c = 0.0f;
  return smallGemm(CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1) && c == 2.0f;
}

// Runs smallGemm on C = alpha op(A) op(B) + beta C and checks every element (and that the
// padding columns of C are untouched) against the sum in double.
void check(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, float beta,
           bool nanInC = false) {
  SCOPED_TRACE(::testing::Message() << (ta == CblasTrans ? "T" : "N") << (tb == CblasTrans ? "T" : "N") << " m " << m
                                    << " n " << n << " k " << k << " alpha " << alpha << " beta " << beta);
  std::mt19937 rng(static_cast<uint32_t>(m * 7919 + n * 104729 + k * 31 + (ta == CblasTrans) * 2 + (tb == CblasTrans)));
  const Operand a = ta == CblasTrans ? randomMatrix(k, m, 3, rng) : randomMatrix(m, k, 5, rng);
  const Operand b = tb == CblasTrans ? randomMatrix(n, k, 1, rng) : randomMatrix(k, n, 2, rng);
  Operand c = randomMatrix(m, n, 4, rng);
  if (nanInC)
    for (float& x : c.data) x = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = c.data;
  auto at = [](const Operand& x, bool trans, int64_t i, int64_t j) {
    return static_cast<double>(trans ? x.data[static_cast<size_t>(j * x.ld + i)] : x.data[static_cast<size_t>(i * x.ld + j)]);
  };
  ASSERT_TRUE(smallGemm(ta, tb, m, n, k, alpha, a.data.data(), a.ld, b.data.data(), b.ld, beta, c.data.data(), c.ld));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < c.ld; ++j) {
      const size_t at_ij = static_cast<size_t>(i * c.ld + j);
      if (j >= n) {
        ASSERT_TRUE(std::isnan(before[at_ij]) ? std::isnan(c.data[at_ij]) : c.data[at_ij] == before[at_ij])
            << "padding column " << j << " of row " << i << " was written";
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = at(a, ta == CblasTrans, i, p) * at(b, tb == CblasTrans, p, j);
        sum += term;
        magnitude += std::fabs(term);
      }
      double expected = alpha * sum;
      if (beta != 0.0f) {
        expected += beta * static_cast<double>(before[at_ij]);
        magnitude += std::fabs(beta * before[at_ij] / alpha);
      }
      // Float rounding of a k-term sum, with room: about eps * sqrt(k) of its magnitude.
      const double tolerance = 1e-7 * std::sqrt(k + 1.0) * std::fabs(alpha) * magnitude + 1e-7;
      ASSERT_NEAR(c.data[at_ij], expected, tolerance) << "C[" << i << ", " << j << "]";
    }
  }
}

class SmallGemm : public ::testing::Test {
 protected:
  // The kernels serve one-thread OpenBLAS only.
  void SetUp() override {
    threads_ = openblas_get_num_threads();
    openblas_set_num_threads(1);
    if (!supported()) GTEST_SKIP() << "no AVX-512 here: every product goes to OpenBLAS";
  }
  void TearDown() override { openblas_set_num_threads(threads_); }
  int threads_ = 1;
};

TEST_F(SmallGemm, NNOverTileRemainders) {
  for (int64_t m : {1, 5, 6, 7, 13, 64})
    for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 130})
      for (int64_t k : {1, 3, 64, 257}) check(CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, 0.0f);
}

TEST_F(SmallGemm, TNOverTileRemainders) {
  for (int64_t m : {1, 5, 6, 7, 13, 70})
    for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 130})
      for (int64_t k : {1, 3, 64, 129}) check(CblasTrans, CblasNoTrans, m, n, k, 1.0f, 0.0f);
}

TEST_F(SmallGemm, NTOverTileRemaindersAndBlocksOf64Rows) {
  for (int64_t m : {1, 5, 6, 7, 63, 64, 65, 130})
    for (int64_t n : {32, 33, 37, 64, 130})
      for (int64_t k : {1, 3, 64, 257}) check(CblasNoTrans, CblasTrans, m, n, k, 1.0f, 0.0f);
}

TEST_F(SmallGemm, AlphaAndBetaScaleAsBlasDoes) {
  for (auto [ta, tb] : {std::pair{CblasNoTrans, CblasNoTrans}, std::pair{CblasTrans, CblasNoTrans},
                        std::pair{CblasNoTrans, CblasTrans}}) {
    check(ta, tb, 7, 70, 33, 0.25f, 1.0f);
    check(ta, tb, 6, 64, 16, -2.0f, -0.5f);
    check(ta, tb, 13, 33, 5, 1.0f, 1.0f);
  }
}

TEST_F(SmallGemm, BetaZeroOverwritesANaNInC) {
  check(CblasNoTrans, CblasNoTrans, 7, 70, 9, 1.0f, 0.0f, /*nanInC=*/true);
  check(CblasTrans, CblasNoTrans, 7, 70, 9, 1.0f, 0.0f, /*nanInC=*/true);
  check(CblasNoTrans, CblasTrans, 7, 70, 9, 1.0f, 0.0f, /*nanInC=*/true);
}

TEST_F(SmallGemm, TheShapesOfAnMlpStep) {
  // Forward, input gradient and weight gradient of 784-512-256 at a batch of 64 and 128.
  for (int64_t batch : {64, 128}) {
    check(CblasNoTrans, CblasTrans, batch, 512, 784, 1.0f, 1.0f);
    check(CblasNoTrans, CblasNoTrans, batch, 512, 256, 1.0f, 0.0f);
    check(CblasTrans, CblasNoTrans, 512, 784, batch, 1.0f, 0.0f);
  }
}

TEST_F(SmallGemm, TheShapesOfAnLmStepInBlocks) {
  // A transformer's linears over 600 tokens (blocks of 256 rows, the last partial) and the
  // weight gradient over them (inner chunks of 512 added into C, also with beta 1).
  check(CblasNoTrans, CblasNoTrans, 600, 128, 384, 1.0f, 0.0f);
  check(CblasNoTrans, CblasNoTrans, 513, 64, 64, 1.0f, 1.0f);
  check(CblasTrans, CblasNoTrans, 384, 128, 1100, 1.0f, 0.0f);
  check(CblasTrans, CblasNoTrans, 64, 70, 1025, 0.5f, 1.0f);
  // A weight gradient whose B chunk is past half of L2 (520 x 512): B's panels outside.
  check(CblasTrans, CblasNoTrans, 70, 520, 1100, 1.0f, 0.0f);
  check(CblasTrans, CblasNoTrans, 70, 300, 1000, 0.5f, 1.0f);
  // Their forward, C = X W^T onto the bias (beta 1), with W copied transposed: edges of the
  // 16 x 16 copy squares in both of W's sizes.
  check(CblasNoTrans, CblasTrans, 600, 384, 128, 1.0f, 1.0f);
  check(CblasNoTrans, CblasTrans, 257, 70, 75, 0.5f, 0.0f);
}

// smallLinear: C = X W^T + bias (in the tiles' store) and G = gelu(C), against the sum in
// double and the erf form, over row blocks (the last partial), tile remainders in both of
// C's sizes and padded leading dimensions; without a bias and without G; and the shapes it
// leaves to the unfused path.
void checkLinear(int64_t m, int64_t n, int64_t k, bool bias, bool gelu) {
  SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " bias " << bias << " gelu " << gelu);
  std::mt19937 rng(static_cast<uint32_t>(m * 31 + n * 7 + k));
  const Operand x = randomMatrix(m, k, 3, rng), w = randomMatrix(n, k, 2, rng), b = randomMatrix(1, n, 0, rng);
  Operand c = randomMatrix(m, n, 1, rng), g = randomMatrix(m, n, 5, rng);
  const std::vector<float> gBefore = g.data;
  ASSERT_TRUE(smallLinear(m, n, k, x.data.data(), x.ld, w.data.data(), w.ld, bias ? b.data.data() : nullptr,
                          c.data.data(), c.ld, gelu ? g.data.data() : nullptr, g.ld));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias ? b.data[static_cast<size_t>(j)] : 0.0, magnitude = std::fabs(sum);
      for (int64_t p = 0; p < k; ++p) {
        const double term = static_cast<double>(x.data[static_cast<size_t>(i * x.ld + p)]) *
                            w.data[static_cast<size_t>(j * w.ld + p)];
        sum += term;
        magnitude += std::fabs(term);
      }
      const float pre = c.data[static_cast<size_t>(i * c.ld + j)];
      ASSERT_NEAR(pre, sum, 1e-7 * std::sqrt(k + 2.0) * magnitude + 1e-7) << "C[" << i << ", " << j << "]";
      const size_t at = static_cast<size_t>(i * g.ld + j);
      if (!gelu) {
        ASSERT_EQ(g.data[at], gBefore[at]) << "G[" << i << ", " << j << "] written without GELU";
        continue;
      }
      const double expected = 0.5 * pre * (1.0 + std::erf(pre / std::sqrt(2.0)));
      ASSERT_NEAR(g.data[at], expected, 4e-7 * std::max(1.0, std::fabs(static_cast<double>(pre)))) << "G[" << i << ", " << j << "]";
    }
}

TEST_F(SmallGemm, LinearWithBiasAndGelu) {
  checkLinear(600, 512, 128, true, true);
  checkLinear(259, 70, 75, true, true);
  checkLinear(300, 131, 64, false, true);
  checkLinear(300, 64, 100, true, false);
  checkLinear(257, 200, 66, false, false);
  // Not many rows, a narrow W or one too large to copy transposed: left to the caller.
  std::vector<float> a(600 * 600, 1.0f), out(600 * 600);
  EXPECT_FALSE(smallLinear(256, 128, 128, a.data(), 128, a.data(), 128, nullptr, out.data(), 128, nullptr, 0));
  EXPECT_FALSE(smallLinear(600, 32, 128, a.data(), 128, a.data(), 128, nullptr, out.data(), 32, nullptr, 0));
  EXPECT_FALSE(smallLinear(600, 600, 600, a.data(), 600, a.data(), 600, nullptr, out.data(), 600, nullptr, 0));
}

TEST_F(SmallGemm, LeavesOtherProductsToOpenBlas) {
  float a[4] = {}, b[4] = {}, c[4] = {};
  EXPECT_FALSE(smallGemm(CblasTrans, CblasTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2));
  std::vector<float> big(300 * 8, 1.0f), out(300 * 8);
  // A batch of 300 rows is past the small range for NN and NT.
  EXPECT_FALSE(smallGemm(CblasNoTrans, CblasNoTrans, 300, 8, 8, 1.0f, big.data(), 8, big.data(), 8, 0.0f,
                         out.data(), 8));
  EXPECT_FALSE(smallGemm(CblasNoTrans, CblasTrans, 300, 8, 8, 1.0f, big.data(), 8, big.data(), 8, 0.0f,
                         out.data(), 8));
  // And an NT product over many rows whose B (1200 x 1000) is too large to copy transposed.
  std::vector<float> wide(1200 * 1000, 1.0f), wideOut(300 * 1200);
  EXPECT_FALSE(smallGemm(CblasNoTrans, CblasTrans, 300, 1200, 1000, 1.0f, wide.data(), 1000, wide.data(), 1000,
                         0.0f, wideOut.data(), 1200));
  // So is an inner dimension of 600 for TN.
  std::vector<float> tall(600 * 8, 1.0f);
  EXPECT_FALSE(smallGemm(CblasTrans, CblasNoTrans, 8, 8, 600, 1.0f, tall.data(), 8, tall.data(), 8, 0.0f,
                         out.data(), 8));
  // alpha = 0, where BLAS reads neither A nor B.
  EXPECT_FALSE(smallGemm(CblasNoTrans, CblasNoTrans, 2, 2, 2, 0.0f, a, 2, b, 2, 1.0f, c, 2));
  // And an empty product.
  EXPECT_FALSE(smallGemm(CblasNoTrans, CblasNoTrans, 0, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2));
}

TEST_F(SmallGemm, SeveralOpenBlasThreadsKeepOpenBlas) {
  openblas_set_num_threads(2);
  float a = 1.0f, b = 2.0f, c = 0.0f;
  EXPECT_FALSE(smallGemm(CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1));
}

}  // namespace
}  // namespace kolo::detail
