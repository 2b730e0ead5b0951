// The vectorised f32 row kernels (GELU, softmax, log-softmax, cross-entropy, LayerNorm and
// their gradients) against the generic f64 loops that the same kernels run for f64 input,
// over row lengths that are and are not multiples of the vector width, with large and
// -inf values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/row_kernels.h"
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

// The GELU row kernels, as this CPU runs them (the table polynomials where it has AVX-512)
// and as one without AVX-512 does, against the erf form in f64 on a grid of x in [-12, 12]
// (every table interval, past its end at 8, both signs), over lengths with vector tails.
struct GeluKernels {
  const char* name;
  void (*gelu)(const float*, float*, int64_t);
  void (*backward)(const float*, const float*, float*, int64_t);
  void (*biasGelu)(float*, const float*, float*, int64_t, int64_t);
  void (*backwardBias)(const float*, const float*, float*, float*, int64_t, int64_t);
};

class GeluRows : public ::testing::TestWithParam<GeluKernels> {};

double geluF64(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double geluDerivativeF64(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

TEST_P(GeluRows, MatchTheErfFormWithinFloatTolerance) {
  const GeluKernels k = GetParam();
  std::vector<float> x;
  for (double v = -12.0; v <= 12.0; v += 0.00731) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 0.25f, 8.0f, -8.0f, 7.99999f, 0x1.fffffep2f, -0x1.fffffep2f, 0x1.000002p3f,
                  1e-30f, -1e30f, 1e30f})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), d(x.size()), ones(x.size(), 1.0f);
  k.gelu(x.data(), y.data(), n);
  k.backward(ones.data(), x.data(), d.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i], scale = std::max(1.0, std::abs(v));
    EXPECT_LE(std::abs(y[i] - geluF64(v)), 4e-7 * scale) << k.name << " gelu(" << v << ")";
    EXPECT_LE(std::abs(d[i] - geluDerivativeF64(v)), 4e-7) << k.name << " gelu'(" << v << ")";
  }
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float special[] = {nan, inf};
  float out[2], grad[1];
  k.gelu(special, out, 2);
  EXPECT_TRUE(std::isnan(out[0])) << k.name;
  EXPECT_EQ(out[1], inf) << k.name;
  k.backward(ones.data(), special, grad, 1);
  EXPECT_TRUE(std::isnan(grad[0])) << k.name;
}

TEST_P(GeluRows, BiasAndRowsAsTheElementwiseKernels) {
  const GeluKernels k = GetParam();
  for (int64_t n : {1, 15, 16, 17, 37, 64, 130}) {
    const int64_t rows = 3;
    Generator gen(static_cast<uint64_t>(n));
    const std::vector<double> pre0 = Tensor::randn({rows, n}, gen, 0.0, 3.0).toDoubleVector(),
                              bias0 = Tensor::randn({n}, gen).toDoubleVector(),
                              grad0 = Tensor::randn({rows, n}, gen).toDoubleVector();
    std::vector<float> pre(pre0.begin(), pre0.end()), bias(bias0.begin(), bias0.end()),
        grad(grad0.begin(), grad0.end()), y(pre.size()), gpre(pre.size()), gbias(bias.size(), 0.5f);
    k.biasGelu(pre.data(), bias.data(), y.data(), rows, n);
    k.backwardBias(grad.data(), pre.data(), gpre.data(), gbias.data(), rows, n);
    std::vector<double> sums(static_cast<size_t>(n), 0.5);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i) {
        const size_t at = static_cast<size_t>(r * n + i);
        const double v = static_cast<double>(static_cast<float>(pre0[at])) + static_cast<float>(bias0[i]);
        EXPECT_NEAR(pre[at], v, 1e-6 * std::max(1.0, std::abs(v))) << k.name << " n " << n;
        EXPECT_NEAR(y[at], geluF64(v), 1e-6 * std::max(1.0, std::abs(v))) << k.name << " n " << n;
        const double g = static_cast<float>(grad0[at]) * geluDerivativeF64(pre[at]);
        EXPECT_NEAR(gpre[at], g, 1e-6 * std::max(1.0, std::abs(g))) << k.name << " n " << n;
        sums[static_cast<size_t>(i)] += gpre[at];
      }
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(gbias[i], sums[i], 1e-5) << k.name << " n " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RowKernels, GeluRows,
    ::testing::Values(GeluKernels{"dispatched", detail::geluRows, detail::geluBackwardRows, detail::biasGeluRows,
                                  detail::geluBackwardBiasRows},
                      GeluKernels{"portable", detail::geluRowsPortable, detail::geluBackwardRowsPortable,
                                  detail::biasGeluRowsPortable, detail::geluBackwardBiasRowsPortable}),
    [](const ::testing::TestParamInfo<GeluKernels>& info) { return std::string(info.param.name); });

// The causal softmax of an attention block, as this CPU runs it and as one without AVX-512
// does, against f64: P over each row's visible keys, 0 after them, the log-sum-exp, P again
// from that log-sum-exp, and the columns past `keys` untouched; blocks of 1 to 64 keys, with
// scores around 0 and around -200 (the lanes past a row's visible keys then exponentiate
// values above 88, which must not reach P).
class CausalSoftmax
    : public ::testing::TestWithParam<void (*)(float*, int64_t, int64_t, int64_t, int64_t, float*, bool)> {};

TEST_P(CausalSoftmax, MatchesF64OverEachRowsVisibleKeys) {
  for (double offset : {0.0, -200.0}) {
    for (int64_t keys : {1, 7, 16, 17, 32, 45, 64}) {
      const int64_t rows = std::min<int64_t>(keys, 5), r0 = keys - rows, ld = keys + 3;
      std::vector<double> s0 = randomTensor({rows, ld}, 4.0, static_cast<uint64_t>(keys)).toDoubleVector();
      for (double& v : s0) v += offset;
      std::vector<float> s(s0.begin(), s0.end()), lse(static_cast<size_t>(rows));
      GetParam()(s.data(), ld, rows, keys, r0, lse.data(), false);
      std::vector<float> again(s0.begin(), s0.end());
      GetParam()(again.data(), ld, rows, keys, r0, lse.data(), true);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t visible = r0 + i + 1;
        double mx = -INFINITY, total = 0.0;
        for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, static_cast<double>(static_cast<float>(s0[i * ld + j])));
        for (int64_t j = 0; j < visible; ++j) total += std::exp(static_cast<float>(s0[i * ld + j]) - mx);
        EXPECT_NEAR(lse[i], mx + std::log(total), 1e-6 * std::max(1.0, std::abs(mx)))
            << "keys " << keys << " row " << i << " offset " << offset;
        for (int64_t j = 0; j < ld; ++j) {
          const size_t at = static_cast<size_t>(i * ld + j);
          if (j >= keys) {
            EXPECT_EQ(s[at], static_cast<float>(s0[at])) << "column " << j << " past the keys was written";
            continue;
          }
          const double p = j < visible ? std::exp(static_cast<float>(s0[at]) - mx) / total : 0.0;
          EXPECT_NEAR(s[at], p, 1e-6) << "keys " << keys << " P[" << i << ", " << j << "], offset " << offset;
          // From the log-sum-exp, P carries its rounding: e^(s - lse) is off by about |lse| ulps.
          EXPECT_NEAR(again[at], p, 1e-6 * std::max(1.0, std::abs(mx)))
              << "keys " << keys << " P[" << i << ", " << j << "] from the log-sum-exp, offset " << offset;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RowKernels, CausalSoftmax,
                         ::testing::Values(detail::causalSoftmaxRows, detail::causalSoftmaxRowsPortable),
                         [](const auto& info) { return info.index == 0 ? "dispatched" : "portable"; });

// softmaxBackwardRows, as this CPU runs it and as one without AVX-512 does, against the sum
// in f64, over lengths with and without vector tails, row strides wider than the rows (columns
// past n untouched) and 6 rows (a group of 4 side by side and two alone).
class SoftmaxBackward
    : public ::testing::TestWithParam<void (*)(const float*, int64_t, float*, int64_t, int64_t, int64_t, float)> {};

TEST_P(SoftmaxBackward, MatchesF64) {
  for (int64_t n : {1, 15, 16, 17, 45, 64}) {
    const int64_t rows = 6, ldp = n + 2, ldd = n + 5;
    const std::vector<double> p0 = randomTensor({rows, ldp}, 0.3, static_cast<uint64_t>(n)).toDoubleVector(),
                              d0 = randomTensor({rows, ldd}, 1.0, static_cast<uint64_t>(n + 50)).toDoubleVector();
    const std::vector<float> p(p0.begin(), p0.end());
    std::vector<float> d(d0.begin(), d0.end());
    GetParam()(p.data(), ldp, d.data(), ldd, rows, n, 0.25f);
    for (int64_t i = 0; i < rows; ++i) {
      double dot = 0.0;
      for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(p[i * ldp + j]) * static_cast<float>(d0[i * ldd + j]);
      for (int64_t j = 0; j < ldd; ++j) {
        const size_t at = static_cast<size_t>(i * ldd + j);
        const double expected = j < n ? p[i * ldp + j] * (static_cast<float>(d0[at]) - dot) * 0.25 : static_cast<float>(d0[at]);
        EXPECT_NEAR(d[at], expected, 1e-6) << "n " << n << " [" << i << ", " << j << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RowKernels, SoftmaxBackward,
                         ::testing::Values(detail::softmaxBackwardRows, detail::softmaxBackwardRowsPortable),
                         [](const auto& info) { return info.index == 0 ? "dispatched" : "portable"; });

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

// The LayerNorm row kernels, as this CPU runs them and as one without AVX-512 does, against
// the f64 loops: outputs, saved statistics and the three gradients (gw and gb added to what
// they held), over lengths with vector tails, with and without the affine parameters.
struct LayerNormKernels {
  const char* name;
  void (*forward)(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, float);
  void (*backward)(const float*, const float*, const float*, const float*, const float*, int64_t, int64_t, float*,
                   float*, float*);
};

class LayerNormRows : public ::testing::TestWithParam<LayerNormKernels> {};

std::vector<float> floats(const Tensor& t) {
  const std::vector<double> v = t.toDoubleVector();
  return {v.begin(), v.end()};
}

Tensor rowsOf(const std::vector<float>& v, const Shape& shape) {
  return Tensor::fromVector(shape, std::vector<double>(v.begin(), v.end()));
}

TEST_P(LayerNormRows, MatchF64) {
  const LayerNormKernels k = GetParam();
  for (int64_t n : {1, 15, 16, 24, 33, 128, 130}) {
    const int64_t rows = 7;
    const Tensor x = kernels::affineScalar(randomTensor({rows, n}, 2.0, n), 1.0, 3.0);
    const Tensor w = randomTensor({n}, 1.0, n + 1), b = randomTensor({n}, 1.0, n + 2);
    const Tensor g = randomTensor({rows, n}, 1.0, n + 3);
    for (bool affine : {true, false}) {
      const Tensor wd = affine ? w : Tensor(), bd = affine ? b : Tensor();
      Tensor m64, r64, gx64, gw64, gb64;
      const Tensor y64 = kernels::layerNormForward(x, wd, bd, n, 1e-5, &m64, &r64);
      kernels::layerNormBackward(g, x, wd, m64, r64, n, &gx64, &gw64, &gb64);
      const std::vector<float> xs = floats(x), ws = floats(w), bs = floats(b), gs = floats(g);
      std::vector<float> y(xs.size()), mean(rows), rstd(rows), gx(xs.size());
      k.forward(xs.data(), affine ? ws.data() : nullptr, affine ? bs.data() : nullptr, y.data(), mean.data(),
                rstd.data(), rows, n, 1e-5f);
      EXPECT_LE(error(rowsOf(y, {rows, n}), y64), kTol) << k.name << " n " << n;
      EXPECT_LE(error(rowsOf(mean, {rows}), m64), kTol) << k.name << " n " << n;
      EXPECT_LE(error(rowsOf(rstd, {rows}), r64), kTol) << k.name << " n " << n;
      // gw and gb start at 1 and are added to.
      std::vector<float> gw(static_cast<size_t>(n), 1.0f), gb(static_cast<size_t>(n), 1.0f);
      k.backward(gs.data(), xs.data(), affine ? ws.data() : nullptr, mean.data(), rstd.data(), rows, n, gx.data(),
                 gw.data(), gb.data());
      EXPECT_LE(error(rowsOf(gx, {rows, n}), gx64), 4 * kTol) << k.name << " n " << n;
      EXPECT_LE(error(rowsOf(gw, {n}), kernels::affineScalar(gw64, 1.0, 1.0)), kTol) << k.name << " n " << n;
      EXPECT_LE(error(rowsOf(gb, {n}), kernels::affineScalar(gb64, 1.0, 1.0)), kTol) << k.name << " n " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RowKernels, LayerNormRows,
                         ::testing::Values(LayerNormKernels{"dispatched", detail::layerNormRows,
                                                            detail::layerNormBackwardRows},
                                           LayerNormKernels{"portable", detail::layerNormRowsPortable,
                                                            detail::layerNormBackwardRowsPortable}),
                         [](const ::testing::TestParamInfo<LayerNormKernels>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace kolo
