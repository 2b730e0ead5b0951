// The vectorised f32 row kernels (GELU, softmax, log-softmax, cross-entropy, LayerNorm and
// their gradients) against the generic f64 loops that the same kernels run for f64 input,
// over row lengths that are and are not multiples of the vector width, with large and
// -inf values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/vector_math.h"

namespace kolo {
namespace {

Tensor randomTensor(const Shape& shape, double scale, uint64_t seed) {
  Generator gen(seed);
  return kernels::affineScalar(Tensor::randn(shape, gen).to(DType::F64), scale, 0.0);
}

// max |f32 - f64| / max(1, max |f64|).
double error(const Tensor& f32, const Tensor& f64) {
  const std::vector<double> a = f32.toDoubleVector(), b = f64.toDoubleVector();
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, ref = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return diff / ref;
}

constexpr double kTol = 2e-6;

TEST(RowKernels, ExpAndErfApproximations) {
  for (double x = -90.0; x <= 89.0; x += 0.0137) {
    const float e = detail::expApprox(static_cast<float>(x));
    const double ref = std::exp(static_cast<double>(static_cast<float>(x)));
    if (x < -87.3) EXPECT_EQ(e, 0.0f) << x;
    else if (x > 88.3) EXPECT_TRUE(std::isinf(e)) << x;
    else EXPECT_LE(std::abs(e - ref), 3e-7 * ref) << x;
  }
  EXPECT_EQ(detail::expApprox(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(detail::expApprox(std::numeric_limits<float>::quiet_NaN())));
  for (double x = -6.0; x <= 6.0; x += 0.001)
    EXPECT_LE(std::abs(detail::erfApprox(static_cast<float>(x)) - std::erf(static_cast<double>(static_cast<float>(x)))), 5e-7)
        << x;
}

TEST(RowKernels, GeluAndItsGradientMatchF64) {
  for (int64_t n : {1, 15, 16, 37, 512}) {
    const Tensor x = randomTensor({3, n}, 3.0, n), g = randomTensor({3, n}, 1.0, n + 100);
    EXPECT_LE(error(kernels::unary(kernels::UnaryOp::Gelu, x.to(DType::F32)), kernels::unary(kernels::UnaryOp::Gelu, x)),
              kTol)
        << n;
    EXPECT_LE(error(kernels::geluBackward(g.to(DType::F32), x.to(DType::F32)), kernels::geluBackward(g, x)), kTol) << n;
  }
}

TEST(RowKernels, SoftmaxAndLogSoftmaxMatchF64) {
  for (int64_t n : {1, 7, 16, 64, 100, 256}) {
    Tensor x = randomTensor({5, n}, 4.0, n);
    // A causal row: everything after the first element is -inf.
    double* row = x.data<double>();
    for (int64_t j = 1; j < n; ++j) row[j] = -std::numeric_limits<double>::infinity();
    const Tensor x32 = x.to(DType::F32);
    for (bool log : {false, true}) {
      const Tensor y = log ? kernels::logSoftmax(x, 1) : kernels::softmax(x, 1);
      const Tensor y32 = log ? kernels::logSoftmax(x32, 1) : kernels::softmax(x32, 1);
      EXPECT_LE(error(y32, y), kTol) << n << (log ? " log" : "");
      const Tensor g = randomTensor({5, n}, 1.0, n + 7);
      if (!log) {
        EXPECT_LE(error(kernels::softmaxBackward(g.to(DType::F32), y32, 1), kernels::softmaxBackward(g, y, 1)),
                  kTol)
            << n;
      }
    }
  }
}

TEST(RowKernels, CrossEntropyMatchesF64) {
  const Tensor logits = randomTensor({33, 256}, 5.0, 3);
  std::vector<int64_t> labels(33);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i * 37 % 256);
  const Tensor y = Tensor::fromVector({33}, labels);
  Tensor p64, p32;
  const Tensor l64 = kernels::crossEntropyForward(logits, y, &p64);
  const Tensor l32 = kernels::crossEntropyForward(logits.to(DType::F32), y, &p32);
  EXPECT_NEAR(l32.item(), l64.item(), kTol * std::abs(l64.item()));
  EXPECT_LE(error(p32, p64), kTol);
}

TEST(RowKernels, LayerNormAndItsGradientsMatchF64) {
  for (int64_t n : {1, 24, 128, 130}) {
    const Tensor x = kernels::affineScalar(randomTensor({6, n}, 2.0, n), 1.0, 3.0);
    const Tensor w = randomTensor({n}, 1.0, n + 1), b = randomTensor({n}, 1.0, n + 2);
    const Tensor g = randomTensor({6, n}, 1.0, n + 3);
    for (bool affine : {true, false}) {
      const Tensor wd = affine ? w : Tensor(), bd = affine ? b : Tensor();
      const Tensor w32 = affine ? w.to(DType::F32) : Tensor(), b32 = affine ? b.to(DType::F32) : Tensor();
      Tensor m64, r64, m32, r32;
      const Tensor y64 = kernels::layerNormForward(x, wd, bd, n, 1e-5, &m64, &r64);
      const Tensor y32 = kernels::layerNormForward(x.to(DType::F32), w32, b32, n, 1e-5, &m32, &r32);
      EXPECT_LE(error(y32, y64), kTol) << n;
      Tensor gx64, gw64, gb64, gx32, gw32, gb32;
      kernels::layerNormBackward(g, x, wd, m64, r64, n, &gx64, &gw64, &gb64);
      kernels::layerNormBackward(g.to(DType::F32), x.to(DType::F32), w32, m32, r32, n, &gx32, &gw32, &gb32);
      EXPECT_LE(error(gx32, gx64), 4 * kTol) << n;
      EXPECT_LE(error(gw32, gw64), kTol) << n;
      EXPECT_LE(error(gb32, gb64), kTol) << n;
    }
  }
}

}  // namespace
}  // namespace kolo
