// Convolution and max-pool kernels against direct (definition-by-sum) references over
// strides, paddings, rectangular kernels, pointwise convolutions, NaN and ties (f32
// convolutions take the shifted rows where AVX-512 is, strided ones by phases, the others im2col).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <tuple>

#include "tensor/kernels.h"

namespace kolo {
namespace {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, stride, pad;
};
void PrintTo(const ConvCase& k, std::ostream* os) {
  *os << "x [" << k.n << ", " << k.c << ", " << k.h << ", " << k.w << "] w [" << k.o << ", " << k.c << ", " << k.kh
      << ", " << k.kw << "] stride " << k.stride << " pad " << k.pad;
}

// out[n,o,y,x] = b[o] + sum_{c,i,j} w[o,c,i,j] * x[n, c, y*s-p+i, x*s-p+j] (zero outside).
struct DirectConv {
  ConvCase k;
  int64_t oh() const { return (k.h + 2 * k.pad - k.kh) / k.stride + 1; }
  int64_t ow() const { return (k.w + 2 * k.pad - k.kw) / k.stride + 1; }
  // Calls f(outIndex, xIndex, wIndex) for every product term of the sum.
  template <class F>
  void forEachTerm(F f) const {
    for (int64_t n = 0; n < k.n; ++n)
      for (int64_t o = 0; o < k.o; ++o)
        for (int64_t y = 0; y < oh(); ++y)
          for (int64_t x = 0; x < ow(); ++x)
            for (int64_t c = 0; c < k.c; ++c)
              for (int64_t i = 0; i < k.kh; ++i)
                for (int64_t j = 0; j < k.kw; ++j) {
                  const int64_t iy = y * k.stride - k.pad + i, ix = x * k.stride - k.pad + j;
                  if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                  f(((n * k.o + o) * oh() + y) * ow() + x, ((n * k.c + c) * k.h + iy) * k.w + ix,
                    ((o * k.c + c) * k.kh + i) * k.kw + j);
                }
  }
};

void expectClose(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  std::vector<double> g = got.toDoubleVector();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " element " << i;
}

class ConvKernel : public ::testing::TestWithParam<std::tuple<ConvCase, DType>> {};

TEST_P(ConvKernel, ForwardAndGradientsMatchDirectSums) {
  const auto [k, dtype] = GetParam();
  const DirectConv ref{k};
  Generator gen(7);
  Tensor x = Tensor::rand({k.n, k.c, k.h, k.w}, gen, -1, 1, dtype);
  Tensor w = Tensor::rand({k.o, k.c, k.kh, k.kw}, gen, -1, 1, dtype);
  Tensor b = Tensor::rand({k.o}, gen, -1, 1, dtype);
  Tensor g = Tensor::rand({k.n, k.o, ref.oh(), ref.ow()}, gen, -1, 1, dtype);
  const std::vector<double> xv = x.toDoubleVector(), wv = w.toDoubleVector(), bv = b.toDoubleVector(),
                            gv = g.toDoubleVector();
  std::vector<double> out(g.numel()), dx(x.numel(), 0.0), dw(w.numel(), 0.0), db(k.o, 0.0);
  for (int64_t i = 0; i < g.numel(); ++i) out[i] = bv[(i / (ref.oh() * ref.ow())) % k.o];
  ref.forEachTerm([&](int64_t oi, int64_t xi, int64_t wi) {
    out[oi] += wv[wi] * xv[xi];
    dx[xi] += wv[wi] * gv[oi];
    dw[wi] += xv[xi] * gv[oi];
  });
  for (int64_t i = 0; i < g.numel(); ++i) db[(i / (ref.oh() * ref.ow())) % k.o] += gv[i];

  const double tol = dtype == DType::F64 ? 1e-12 : 1e-4;
  kernels::Conv2dParams p{k.stride, k.stride, k.pad, k.pad};
  expectClose(kernels::conv2dForward(x, w, b, p), out, tol, "output");
  std::vector<double> noBias = out;
  for (int64_t i = 0; i < g.numel(); ++i) noBias[i] -= bv[(i / (ref.oh() * ref.ow())) % k.o];
  expectClose(kernels::conv2dForward(x, w, Tensor(), p), noBias, tol, "output without bias");
  Tensor gx, gw, gb;
  kernels::conv2dBackward(g, x, w, p, &gx, &gw, &gb);
  expectClose(gx, dx, tol, "input gradient");
  expectClose(gw, dw, tol, "weight gradient");
  expectClose(gb, db, tol, "bias gradient");
  // Each gradient alone gives the same values.
  Tensor onlyW;
  kernels::conv2dBackward(g, x, w, p, nullptr, &onlyW, nullptr);
  expectClose(onlyW, dw, tol, "weight gradient alone");
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, ConvKernel,
    ::testing::Combine(::testing::Values(ConvCase{2, 3, 7, 6, 4, 3, 3, 1, 0},   // plain
                                         ConvCase{2, 2, 7, 8, 3, 3, 3, 2, 1},   // stride and padding
                                         ConvCase{1, 3, 5, 5, 2, 1, 1, 1, 0},   // pointwise
                                         ConvCase{2, 2, 6, 9, 3, 2, 4, 1, 2},   // rectangular, wide pad
                                         ConvCase{3, 1, 9, 9, 2, 5, 5, 3, 1},   // stride 3
                                         ConvCase{2, 4, 12, 12, 5, 5, 5, 1, 0}, // the cnn's second layer shape
                                         ConvCase{3, 5, 11, 9, 7, 3, 3, 1, 1},  // the resnet's 3x3s
                                         ConvCase{2, 1, 10, 10, 16, 3, 3, 1, 1}, // its first, one channel
                                         ConvCase{2, 3, 14, 14, 5, 3, 3, 2, 1},  // its stride-2 3x3s
                                         ConvCase{2, 3, 13, 11, 4, 3, 3, 2, 1},  // the same, odd sizes
                                         ConvCase{2, 3, 9, 8, 5, 1, 1, 2, 0},    // its stride-2 shortcuts
                                         ConvCase{2, 2, 9, 10, 3, 2, 4, 2, 3},   // stride 2, pad past the kernel
                                         ConvCase{0, 2, 5, 5, 3, 3, 3, 1, 0}),  // empty batch
                       ::testing::Values(DType::F32, DType::F64)));

struct PoolCase {
  int64_t h, w, k, s, pad;
};
void PrintTo(const PoolCase& p, std::ostream* os) {
  *os << p.h << "x" << p.w << " kernel " << p.k << " stride " << p.s << " pad " << p.pad;
}

class PoolKernel : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolKernel, ForwardAndBackwardMatchDirectMax) {
  const PoolCase pc = GetParam();
  const int64_t planes = 6, oh = (pc.h + 2 * pc.pad - pc.k) / pc.s + 1, ow = (pc.w + 2 * pc.pad - pc.k) / pc.s + 1;
  Generator gen(3);
  // Few distinct values so that ties occur: the first index in the window must win.
  std::vector<float> xs(static_cast<size_t>(planes * pc.h * pc.w));
  for (auto& v : xs) v = static_cast<float>(static_cast<int>(gen.uniform() * 5.0)) - 2.0f;
  Tensor x = Tensor::fromVector({2, 3, pc.h, pc.w}, xs);
  Tensor idx;
  Tensor out = kernels::maxPool2dForward(x, pc.k, pc.s, pc.pad, &idx);
  ASSERT_EQ(out.shape(), (Shape{2, 3, oh, ow}));
  std::vector<float> got = out.toFloatVector();
  const int32_t* gi = idx.data<int32_t>();
  Tensor g = Tensor::rand(out.shape(), gen, -1, 1);
  std::vector<double> gv = g.toDoubleVector(), dx(xs.size(), 0.0);
  for (int64_t plane = 0; plane < planes; ++plane)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x0 = 0; x0 < ow; ++x0) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t arg = -1;
        for (int64_t i = 0; i < pc.k; ++i)
          for (int64_t j = 0; j < pc.k; ++j) {
            const int64_t iy = y * pc.s - pc.pad + i, ix = x0 * pc.s - pc.pad + j;
            if (iy < 0 || iy >= pc.h || ix < 0 || ix >= pc.w) continue;
            const float v = xs[plane * pc.h * pc.w + iy * pc.w + ix];
            if (arg < 0 || v > best) best = v, arg = iy * pc.w + ix;
          }
        const int64_t at = (plane * oh + y) * ow + x0;
        ASSERT_EQ(got[at], best) << "plane " << plane << " (" << y << ", " << x0 << ")";
        ASSERT_EQ(gi[at], arg) << "plane " << plane << " (" << y << ", " << x0 << ")";
        dx[plane * pc.h * pc.w + arg] += gv[at];
      }
  expectClose(kernels::maxPool2dBackward(g, idx, x.shape()), dx, 1e-6, "input gradient");
}

INSTANTIATE_TEST_SUITE_P(Windows, PoolKernel,
                         ::testing::Values(PoolCase{8, 8, 2, 2, 0}, PoolCase{9, 7, 2, 2, 0}, PoolCase{6, 6, 2, 1, 0},
                                           PoolCase{9, 9, 3, 3, 0}, PoolCase{7, 8, 3, 2, 1}, PoolCase{8, 8, 4, 2, 2},
                                           PoolCase{10, 10, 5, 2, 0}));

TEST(PoolKernel, NanPropagatesInEveryPath) {
  for (const PoolCase pc : {PoolCase{4, 4, 2, 2, 0}, PoolCase{4, 4, 3, 1, 0}, PoolCase{4, 4, 3, 2, 1}}) {
    std::vector<float> xs(16, 1.0f);
    xs[5] = std::numeric_limits<float>::quiet_NaN();  // (1, 1): inside the first window of each case
    Tensor idx;
    Tensor out = kernels::maxPool2dForward(Tensor::fromVector({1, 1, 4, 4}, xs), pc.k, pc.s, pc.pad, &idx);
    EXPECT_TRUE(std::isnan(out.toFloatVector()[0])) << "k " << pc.k << " s " << pc.s << " pad " << pc.pad;
    EXPECT_EQ(idx.data<int32_t>()[0], 5);
  }
}

}  // namespace
}  // namespace kolo
