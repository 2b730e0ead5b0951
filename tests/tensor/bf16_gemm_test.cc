// bf16 products with f32 accumulation (MatmulPrecision::BF16) against a double-precision sum
// of the bf16-rounded operands, on the AVX-512 BF16 path and on the path without it, over
// every transpose a training step uses, odd inner dimensions, tile remainders, alpha/beta;
// and matmul and a linear layer's forward under MatmulPrecisionGuard against f32 products
// of rounded operands.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kolo/precision.h"
#include "tensor/bf16_gemm.h"
#include "tensor/kernels.h"

namespace kolo::detail {
namespace {

float roundBf16(float x) { return bfloat16ToFloat(floatToBFloat16(x)); }

void check(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, float beta,
           bool native) {
  std::mt19937 rng(static_cast<unsigned>(m * 1000003 + n * 1009 + k));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const bool transA = ta != CblasNoTrans, transB = tb != CblasNoTrans;
  const int64_t lda = (transA ? m : k) + 3, ldb = (transB ? k : n) + 2, ldc = n + 1;
  std::vector<float> a(static_cast<size_t>((transA ? k : m) * lda)), b(static_cast<size_t>((transB ? n : k) * ldb));
  std::vector<float> c(static_cast<size_t>(m * ldc));
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  for (float& x : c) x = dist(rng);
  const std::vector<float> before = c;
  gemmBf16(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, native);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = roundBf16(transA ? a[p * lda + i] : a[i * lda + p]);
        const double y = roundBf16(transB ? b[j * ldb + p] : b[p * ldb + j]);
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      const double expected = alpha * sum + beta * before[i * ldc + j];
      const double tolerance = 2e-7 * std::sqrt(k + 1.0) * (std::fabs(alpha) * magnitude + 1.0);
      ASSERT_NEAR(c[i * ldc + j], expected, tolerance)
          << (native ? "native " : "fallback ") << ta << tb << " m " << m << " n " << n << " k " << k << " C[" << i
          << ", " << j << "]";
    }
}

void checkAll(bool native) {
  for (auto [ta, tb] : {std::pair{CblasNoTrans, CblasTrans}, std::pair{CblasNoTrans, CblasNoTrans},
                        std::pair{CblasTrans, CblasNoTrans}})
    for (int64_t m : {1, 5, 6, 13, 37})  // 37: a transposed A packs full vectors of rows
      for (int64_t n : {1, 15, 16, 17, 64, 65, 130})
        for (int64_t k : {1, 2, 7, 64, 129}) check(ta, tb, m, n, k, 1.0f, 0.0f, native);
  check(CblasNoTrans, CblasTrans, 7, 70, 33, 0.5f, 1.0f, native);
  check(CblasTrans, CblasNoTrans, 9, 40, 17, -2.0f, 0.25f, native);
}

TEST(Bf16Gemm, NativeDotProductsSumTheRoundedOperands) {
  if (!haveNativeBf16()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU: only the other path runs";
  checkAll(true);
}

TEST(Bf16Gemm, ThePathWithoutBf16InstructionsSumsTheSame) { checkAll(false); }

TEST(Bf16Gemm, MatmulUnderTheGuardIsTheProductOfRoundedOperands) {
  Generator gen(3);
  const Tensor a = Tensor::randn({37, 70}, gen), b = Tensor::randn({70, 45}, gen);
  auto rounded = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  const Tensor reference = kernels::matmul2d(rounded(a), rounded(b));
  Tensor product;
  {
    MatmulPrecisionGuard bf16(MatmulPrecision::BF16);
    EXPECT_EQ(matmulPrecision(), MatmulPrecision::BF16);
    product = kernels::matmul2d(a, b);
  }
  EXPECT_EQ(matmulPrecision(), MatmulPrecision::F32);
  const std::vector<double> x = product.toDoubleVector(), y = reference.toDoubleVector();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 2e-5 * (1.0 + std::abs(y[i]))) << i;
  // And f32 is not rounded: the plain product differs from the rounded one.
  const std::vector<double> plain = kernels::matmul2d(a, b).toDoubleVector();
  double largest = 0.0;
  for (size_t i = 0; i < x.size(); ++i) largest = std::max(largest, std::abs(plain[i] - y[i]));
  EXPECT_GT(largest, 1e-3);
  EXPECT_EQ(parseMatmulPrecision("bf16"), MatmulPrecision::BF16);
  EXPECT_THROW(parseMatmulPrecision("fp8"), InvalidArgument);
}

TEST(Bf16Gemm, LinearOverManyRowsUnderTheGuardRoundsItsOperands) {
  // 300 rows of 64 over 130 outputs: the shape whose f32 forward goes in one pass with the
  // bias and GELU in the GEMM's store; under bf16 it must still be the rounded product.
  Generator gen(4);
  const Tensor x = Tensor::randn({300, 64}, gen), w = Tensor::randn({130, 64}, gen), b = Tensor::randn({130}, gen);
  auto rounded = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  Tensor referenceGelu;
  const Tensor reference = kernels::linearForward(rounded(x), rounded(w), b, &referenceGelu);
  Tensor product, productGelu, plain;
  {
    MatmulPrecisionGuard bf16(MatmulPrecision::BF16);
    product = kernels::linearForward(x, w, b, &productGelu);
    plain = kernels::linearForward(x, w, b);
  }
  const std::vector<double> p = product.toDoubleVector(), g = productGelu.toDoubleVector(),
                            q = plain.toDoubleVector(), y = reference.toDoubleVector(),
                            yg = referenceGelu.toDoubleVector();
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(p[i], y[i], 2e-5 * (1.0 + std::abs(y[i]))) << i;
    EXPECT_NEAR(q[i], y[i], 2e-5 * (1.0 + std::abs(y[i]))) << i;
    EXPECT_NEAR(g[i], yg[i], 2e-5 * (1.0 + std::abs(yg[i]))) << i;
  }
}

}  // namespace
}  // namespace kolo::detail
