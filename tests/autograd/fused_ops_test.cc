// The fused f32 ops of a transformer step against the same math composed from the separate
// ops in f64: linearGelu (bias and GELU in one pass, and their gradients in one) and
// causalAttention (also checked by central differences in gradcheck_test.cc).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <vector>

#include "kolo/ops.h"

namespace kolo {
namespace {

// max |a - b| / max(1, max |b|).
double relative(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.toDoubleVector(), y = b.toDoubleVector();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0.0, ref = 1.0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    ref = std::max(ref, std::abs(y[i]));
  }
  return diff / ref;
}

// Runs fn over f32 leaves made from `values` (or f64 ones), backward through a fixed random
// projection; returns the output and every input's gradient.
std::vector<Tensor> outputAndGrads(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                   const std::vector<Tensor>& values, DType dtype) {
  std::vector<Tensor> leaves;
  for (const Tensor& v : values) {
    Tensor t = v.to(dtype);
    t.setRequiresGrad(true);
    leaves.push_back(t);
  }
  Tensor y = fn(leaves);
  Generator gen(9);
  sum(y * Tensor::randn(y.shape(), gen, 0.0, 1.0, dtype)).backward();
  std::vector<Tensor> out{y.detach()};
  for (const Tensor& t : leaves) out.push_back(t.grad());
  return out;
}

// Few rows (the product, then bias and GELU in one pass) and many (bias and GELU in the
// GEMM's store where the CPU has AVX-512): input (B, T, K) over N outputs, with vector
// remainders in both dimensions.
class LinearSizes : public ::testing::TestWithParam<std::array<int64_t, 4>> {};

TEST_P(LinearSizes, LinearGeluEqualsLinearThenGelu) {
  const auto [b, t, k, n] = GetParam();
  Generator gen(4);
  const std::vector<Tensor> values = {Tensor::randn({b, t, k}, gen, 0.0, 1.0, DType::F64),
                                      Tensor::randn({n, k}, gen, 0.0, 0.3, DType::F64),
                                      Tensor::randn({n}, gen, 0.0, 0.5, DType::F64)};
  const auto fused = outputAndGrads([](const std::vector<Tensor>& v) { return linearGelu(v[0], v[1], v[2]); },
                                    values, DType::F32);
  const auto reference = outputAndGrads(
      [](const std::vector<Tensor>& v) { return gelu(add(matmul(v[0], v[1].t()), v[2])); }, values, DType::F64);
  const char* what[] = {"output", "input gradient", "weight gradient", "bias gradient"};
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_LE(relative(fused[i], reference[i]), 2e-6) << what[i];
}

TEST_P(LinearSizes, LinearEqualsTheProductPlusTheBias) {
  const auto [b, t, k, n] = GetParam();
  Generator gen(5);
  const std::vector<Tensor> values = {Tensor::randn({b, t, k}, gen, 0.0, 1.0, DType::F64),
                                      Tensor::randn({n, k}, gen, 0.0, 0.3, DType::F64),
                                      Tensor::randn({n}, gen, 0.0, 0.5, DType::F64)};
  const auto fused =
      outputAndGrads([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, values, DType::F32);
  const auto reference = outputAndGrads(
      [](const std::vector<Tensor>& v) { return add(matmul(v[0], v[1].t()), v[2]); }, values, DType::F64);
  const char* what[] = {"output", "input gradient", "weight gradient", "bias gradient"};
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_LE(relative(fused[i], reference[i]), 2e-6) << what[i];
}

INSTANTIATE_TEST_SUITE_P(FusedOps, LinearSizes,
                         ::testing::Values(std::array<int64_t, 4>{3, 5, 24, 130},     // 15 rows
                                           std::array<int64_t, 4>{3, 101, 64, 130},   // 303 rows
                                           std::array<int64_t, 4>{2, 150, 96, 80}));  // 300 rows

// causalAttention keeps P for backward while H T <= 3C and recomputes it beyond: both sizes,
// with T not a multiple of the 32-row query blocks.
class CausalAttentionSizes : public ::testing::TestWithParam<std::array<int64_t, 3>> {};

TEST_P(CausalAttentionSizes, EqualsTheMaskedSoftmaxOfTheHeads) {
  Generator gen(6);
  const auto [t, c, h] = GetParam();
  const int64_t b = 2, hd = c / h;
  const std::vector<Tensor> values = {Tensor::randn({b, t, 3 * c}, gen, 0.0, 1.0, DType::F64)};
  const auto fused = outputAndGrads([h](const std::vector<Tensor>& v) { return causalAttention(v[0], h); }, values,
                                    DType::F32);
  const auto reference = outputAndGrads(
      [&](const std::vector<Tensor>& v) {
        auto head = [&](int64_t i) { return v[0].slice(2, i * c, (i + 1) * c).reshape({b, t, h, hd}).transpose(1, 2); };
        Tensor att = matmul(head(0), head(1).transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));
        att = where(trilMask(t), att, Tensor::scalar(-INFINITY, att.dtype()));
        return matmul(softmax(att, -1), head(2)).transpose(1, 2).reshape({b, t, c});
      },
      values, DType::F64);
  EXPECT_LE(relative(fused[0], reference[0]), 2e-6) << "output";
  EXPECT_LE(relative(fused[1], reference[1]), 2e-6) << "qkv gradient";
}

INSTANTIATE_TEST_SUITE_P(FusedOps, CausalAttentionSizes,
                         ::testing::Values(std::array<int64_t, 3>{45, 16, 2},    // P recomputed: 90 > 48
                                           std::array<int64_t, 3>{45, 48, 2},    // P kept: 90 <= 144
                                           std::array<int64_t, 3>{70, 96, 3}));  // P kept, three blocks

}  // namespace
}  // namespace kolo
