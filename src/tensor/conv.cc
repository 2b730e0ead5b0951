// Convolution (im2col + one GEMM per image, NCHW, weights [O, C, kh, kw]; f32 ones without
// im2col, as products over shifted rows of the zero-bordered image, split into its phases
// when strided). Max pooling is in max_pool.cc.
// One image's column buffer stays in cache between im2col and its GEMM; backward rebuilds
// the columns per image instead of keeping N of them alive from forward.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/gemm.h"
#include "tensor/kernels.h"
#include "tensor/row_loops.h"

namespace kolo::kernels {

namespace {

struct ConvGeometry {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
};

ConvGeometry convGeometry(const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  KOLO_CHECK(x.dim() == 4, "conv2d: input must be [N, C, H, W], got ", shapeString(x.shape()));
  KOLO_CHECK(w.dim() == 4, "conv2d: weight must be [O, C, kh, kw], got ", shapeString(w.shape()));
  KOLO_CHECK(x.shape()[1] == w.shape()[1], "conv2d: input ", shapeString(x.shape()), " has ", x.shape()[1],
             " channels but weight ", shapeString(w.shape()), " expects ", w.shape()[1]);
  KOLO_CHECK(p.strideH > 0 && p.strideW > 0 && p.padH >= 0 && p.padW >= 0, "conv2d: stride ", p.strideH, "x",
             p.strideW, ", padding ", p.padH, "x", p.padW);
  ConvGeometry g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], w.shape()[0], w.shape()[2], w.shape()[3], 0, 0};
  g.oh = (g.h + 2 * p.padH - g.kh) / p.strideH + 1;
  g.ow = (g.w + 2 * p.padW - g.kw) / p.strideW + 1;
  KOLO_CHECK(g.h + 2 * p.padH >= g.kh && g.w + 2 * p.padW >= g.kw && g.oh > 0 && g.ow > 0, "conv2d: kernel ",
             g.kh, "x", g.kw, " larger than padded input ", shapeString(x.shape()));
  return g;
}

// ceil(a / b) for b > 0 and any sign of a.
int64_t ceilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// Output positions [lo, hi) along one axis whose input index o * stride - pad + k lies
// inside [0, inSize); the others read padding.
struct Span {
  int64_t lo, hi;
};
Span validSpan(int64_t outSize, int64_t inSize, int64_t stride, int64_t pad, int64_t k) {
  Span s{std::max<int64_t>(0, ceilDiv(pad - k, stride)), std::min(outSize, ceilDiv(inSize + pad - k, stride))};
  if (s.hi < s.lo) s.hi = s.lo;
  return s;
}

// col [C*kh*kw, oh*ow] from one image [C, H, W]; padding reads as zero.
template <class T>
KOLO_ROW_LOOPS void im2col(const T* __restrict img, const ConvGeometry& g, const Conv2dParams& p,
                           T* __restrict col) {
  const int64_t spatial = g.oh * g.ow;
  if (p.strideH == 1 && p.strideW == 1 && p.padH == 0 && p.padW == 0) {
    // Row (c, ki, kj) is the oh x ow window of plane c shifted by (ki, kj).
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          T* dst = col + ((c * g.kh + ki) * g.kw + kj) * spatial;
          const T* src = img + (c * g.h + ki) * g.w + kj;
          for (int64_t y = 0; y < g.oh; ++y, dst += g.ow, src += g.w)
            for (int64_t x = 0; x < g.ow; ++x) dst[x] = src[x];
        }
    return;
  }
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const Span ys = validSpan(g.oh, g.h, p.strideH, p.padH, ki);
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const Span xs = validSpan(g.ow, g.w, p.strideW, p.padW, kj);
        T* row = col + ((c * g.kh + ki) * g.kw + kj) * spatial;
        for (int64_t i = 0; i < ys.lo * g.ow; ++i) row[i] = T(0);
        for (int64_t i = ys.hi * g.ow; i < spatial; ++i) row[i] = T(0);
        for (int64_t y = ys.lo; y < ys.hi; ++y) {
          T* dst = row + y * g.ow;
          const T* src = img + (c * g.h + y * p.strideH - p.padH + ki) * g.w + kj - p.padW;
          for (int64_t x = 0; x < xs.lo; ++x) dst[x] = T(0);
          if (p.strideW == 1) {
            for (int64_t x = xs.lo; x < xs.hi; ++x) dst[x] = src[x];
          } else {
            for (int64_t x = xs.lo; x < xs.hi; ++x) dst[x] = src[x * p.strideW];
          }
          for (int64_t x = xs.hi; x < g.ow; ++x) dst[x] = T(0);
        }
      }
    }
}

// Adds col [C*kh*kw, oh*ow] back into image [C, H, W] (the adjoint of im2col).
template <class T>
KOLO_ROW_LOOPS void col2im(const T* __restrict col, const ConvGeometry& g, const Conv2dParams& p,
                           T* __restrict img) {
  const int64_t spatial = g.oh * g.ow;
  if (p.strideH == 1 && p.strideW == 1 && p.padH == 0 && p.padW == 0) {
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          const T* src = col + ((c * g.kh + ki) * g.kw + kj) * spatial;
          T* dst = img + (c * g.h + ki) * g.w + kj;
          for (int64_t y = 0; y < g.oh; ++y, src += g.ow, dst += g.w)
            for (int64_t x = 0; x < g.ow; ++x) dst[x] += src[x];
        }
    return;
  }
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const Span ys = validSpan(g.oh, g.h, p.strideH, p.padH, ki);
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const Span xs = validSpan(g.ow, g.w, p.strideW, p.padW, kj);
        const T* row = col + ((c * g.kh + ki) * g.kw + kj) * spatial;
        for (int64_t y = ys.lo; y < ys.hi; ++y) {
          const T* src = row + y * g.ow;
          T* dst = img + (c * g.h + y * p.strideH - p.padH + ki) * g.w + kj - p.padW;
          if (p.strideW == 1) {
            for (int64_t x = xs.lo; x < xs.hi; ++x) dst[x] += src[x];
          } else {
            for (int64_t x = xs.lo; x < xs.hi; ++x) dst[x * p.strideW] += src[x];
          }
        }
      }
    }
}

// Sum of n contiguous values with eight independent partial sums (vectorisable).
template <class T>
T sumContiguous(const T* p, int64_t n) {
  T part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += p[i + j];
  T total = T(0);
  for (; i < n; ++i) total += p[i];
  for (int j = 0; j < 8; ++j) total += part[j];
  return total;
}

bool isPointwise(const ConvGeometry& g, const Conv2dParams& p) {
  return g.kh == 1 && g.kw == 1 && p.strideH == 1 && p.strideW == 1 && p.padH == 0 && p.padW == 0;
}

// ---- f32 convolutions without im2col (shifted rows) ----
//
// With stride 1, row (c, i, j) of an image's im2col columns is plane c of the zero-bordered
// image shifted by i rows and j columns. Computed on the bordered width wp instead of ow, each
// output row gets kw - 1 extra columns, and every such row of columns is one contiguous window
// of the bordered image, starting at c hp wp + i wp + j: the GEMM reads the image itself
// (detail::gemmShiftedB) and the columns are never written. Per image that writes the
// bordered copy (C hp wp floats) instead of the columns (C kh kw oh ow: 9x more for 3x3), and
// the output rows once more when their extra columns are dropped. The input's gradient is
// the same product over the output gradient with the kernel flipped and its channels swapped
// (a stride-1 convolution's adjoint, with padding k - 1 - p), and the weight's gradient the
// transposed product of the shifted rows with the output gradient (detail::gemmShiftedA).
//
// With stride s, each bordered plane is split into its s x s phases (the rows a mod s and
// the columns b mod s, a and b < s), kept one after the other: tap (i, j) of every output
// position then reads phase (i mod s, j mod s) shifted by (i / s, j / s), again one window
// per output row on the phases' width. The weight's gradient is the same transposed product;
// the input's gradient is, phase by phase, a stride-1 product of the bordered output
// gradient with the taps of that phase (stridedInputGrad).

// A kernel smaller than its stride (the resnet's 1x1 stride-2 shortcuts) reads a fraction of
// the image: im2col's gather of those values and a plain GEMM beat the phases there.
bool shiftedRows(const ConvGeometry& g, const Conv2dParams& p) {
  return !isPointwise(g, p) && g.kh >= p.strideH && g.kw >= p.strideW && detail::shiftedRowsAvailable();
}

// A [C, H, W] image at (top, left) of zero planes [hp, wp], each plane split into its
// sh x sw phases of [hq, wq] = [ceil(hp / sh), ceil(wp / sw)], phase (a, b) holding the plane's
// rows a, a + sh, ... and columns b, b + sw, ...: [C, sh, sw, hq, wq], then one row of zeros
// that the last windows read past their end. With stride 1 a plane is its one phase. A kernel
// of kh x kw reads only the phases a < kh, b < kw (a 1x1 kernel with stride 2 one of four):
// load writes only those.
struct BorderedImage {
  int64_t c, h, w, top, left, sh, sw, hq, wq, kh, kw;
  std::vector<float> values;

  BorderedImage(int64_t c0, int64_t h0, int64_t w0, int64_t top0, int64_t left0, int64_t hp, int64_t wp,
                int64_t sh0, int64_t sw0, int64_t kh0, int64_t kw0)
      : c(c0), h(h0), w(w0), top(top0), left(left0), sh(sh0), sw(sw0), hq((hp + sh0 - 1) / sh0),
        wq((wp + sw0 - 1) / sw0), kh(kh0), kw(kw0), values(static_cast<size_t>(c0 * sh0 * sw0 * hq * wq + wq), 0.0f) {}
  int64_t planeSize() const { return sh * sw * hq * wq; }
  // Where tap (i, j) of channel ci starts: phase (i mod sh, j mod sw) shifted by (i / sh, j / sw).
  int64_t offset(int64_t ci, int64_t i, int64_t j) const {
    return ci * planeSize() + ((i % sh) * sw + j % sw) * hq * wq + (i / sh) * wq + j / sw;
  }
  // Every (c, i, j) of the kernel, in the weight's order.
  std::vector<int64_t> kernelOffsets() const {
    std::vector<int64_t> out;
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) out.push_back(offset(ci, i, j));
    return out;
  }
  // The border stays zero from construction: only the interior is written.
  KOLO_ROW_LOOPS void load(const float* __restrict img) {
    float* __restrict base = values.data();
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t y = 0; y < h; ++y) {
        const float* __restrict src = img + (ci * h + y) * w;
        if (sh == 1 && sw == 1) {
          float* __restrict dst = base + (ci * hq + y + top) * wq + left;
          for (int64_t x = 0; x < w; ++x) dst[x] = src[x];
          continue;
        }
        if ((y + top) % sh >= kh) continue;
        for (int64_t b = 0; b < std::min(sw, kw); ++b) {
          const int64_t x0 = ((b - left) % sw + sw) % sw;  // the first column of phase b
          float* __restrict dst = base + offset(ci, y + top, b) + (x0 + left) / sw;
          const int64_t count = (w - x0 + sw - 1) / sw;
          if (sw == 2) {
            for (int64_t v = 0; v < count; ++v) dst[v] = src[x0 + 2 * v];
          } else {
            for (int64_t v = 0; v < count; ++v) dst[v] = src[x0 + sw * v];
          }
        }
      }
  }
};

// out [O, oh, ow] = the convolution of the loaded image with weight [O, C kh kw] (rows at
// `offsets`), plus bias [O] when given; `wide` is scratch for [O, oh, wq].
KOLO_ROW_LOOPS void shiftedConv(const BorderedImage& image, const std::vector<int64_t>& offsets, const float* weight,
                                int64_t o, int64_t oh, int64_t ow, const float* bias, std::vector<float>& wide,
                                float* __restrict out) {
  const int64_t rows = oh * image.wq;
  wide.resize(static_cast<size_t>(o * rows));
  const auto ckk = static_cast<int64_t>(offsets.size());
  detail::gemmShiftedB(o, rows, ckk, weight, ckk, image.values.data(), offsets.data(), wide.data(), rows);
  for (int64_t r = 0; r < o; ++r) {
    const float b = bias ? bias[r] : 0.0f;
    for (int64_t y = 0; y < oh; ++y) {
      const float* src = wide.data() + r * rows + y * image.wq;
      float* dst = out + (r * oh + y) * ow;
      for (int64_t x = 0; x < ow; ++x) dst[x] = src[x] + b;
    }
  }
}

// g [O, oh, ow] into gT [oh wq, O] (the rows' extra columns untouched: they stay zero), in
// blocks of 16 positions so that each block's lines of gT stay in L1 while the O rows pass.
KOLO_ROW_LOOPS void transposeRows(const float* __restrict g, int64_t o, int64_t oh, int64_t ow, int64_t wq,
                                  float* __restrict gT) {
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x0 = 0; x0 < ow; x0 += 16) {
      const int64_t x1 = std::min(ow, x0 + 16);
      for (int64_t r = 0; r < o; ++r) {
        const float* src = g + (r * oh + y) * ow;
        float* dst = gT + (y * wq) * o + r;
        for (int64_t x = x0; x < x1; ++x) dst[x * o] = src[x];
      }
    }
}

// The weight [O, C, kh, kw] flipped in both kernel axes, with O and C swapped: [C, O, kh, kw].
std::vector<float> flippedTransposed(const float* w, const ConvGeometry& g) {
  std::vector<float> out(static_cast<size_t>(g.o * g.c * g.kh * g.kw));
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j)
          out[static_cast<size_t>(((c * g.o + o) * g.kh + (g.kh - 1 - i)) * g.kw + (g.kw - 1 - j))] =
              w[((o * g.c + c) * g.kh + i) * g.kw + j];
  return out;
}

// The input gradient of a strided convolution, phase by phase. In the padded input's
// coordinates, dx[c, s u + a, s v + b] = sum over o, p, q of g[o, u - p, v - q] w[o, c, s p + a,
// s q + b] (g zero outside its [oh, ow]): for phase (a, b) a stride-1 product of g, bordered
// by the most taps any phase has less one, with the phase's taps (p, q) as its rows. Each
// position of dx lies in one phase, so the phases' products, cropped to the unpadded image,
// write dx once.
struct StridedInputGrad {
  struct Phase {
    int64_t a, b, rows;                 // rows: the phase's rows of the padded input
    std::vector<float> weight;          // [C, O taps]
    std::vector<int64_t> offsets;       // (o, p, q) into the bordered gradient
  };
  const ConvGeometry& g;
  const Conv2dParams& p;
  BorderedImage grad;
  std::vector<Phase> phases;
  std::vector<float> wide;

  static int64_t border(int64_t k, int64_t s) { return (k + s - 1) / s - 1; }

  StridedInputGrad(const ConvGeometry& g0, const Conv2dParams& p0, const float* w)
      : g(g0), p(p0),
        grad(g0.o, g0.oh, g0.ow, border(g0.kh, p0.strideH), border(g0.kw, p0.strideW),
             (g0.h + 2 * p0.padH + p0.strideH - 1) / p0.strideH + border(g0.kh, p0.strideH),
             (g0.w + 2 * p0.padW + p0.strideW - 1) / p0.strideW + border(g0.kw, p0.strideW), 1, 1, 1, 1) {
    const int64_t sh = p.strideH, sw = p.strideW, hp = g.h + 2 * p.padH;
    for (int64_t a = 0; a < sh; ++a)
      for (int64_t b = 0; b < sw; ++b) {
        Phase ph{a, b, (hp - a + sh - 1) / sh, {}, {}};
        const int64_t ta = a < g.kh ? (g.kh - a + sh - 1) / sh : 0, tb = b < g.kw ? (g.kw - b + sw - 1) / sw : 0;
        const int64_t depth = g.o * ta * tb;
        ph.weight.resize(static_cast<size_t>(g.c * depth));
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t i = 0; i < ta; ++i)
            for (int64_t j = 0; j < tb; ++j) {
              const int64_t k = (o * ta + i) * tb + j;
              ph.offsets.push_back(grad.offset(o, grad.top - i, grad.left - j));
              for (int64_t c = 0; c < g.c; ++c)
                ph.weight[static_cast<size_t>(c * depth + k)] =
                    w[((o * g.c + c) * g.kh + sh * i + a) * g.kw + sw * j + b];
            }
        phases.push_back(std::move(ph));
      }
  }

  // dx [C, H, W] from one image's output gradient gn [O, oh, ow].
  KOLO_ROW_LOOPS void run(const float* gn, float* __restrict dx) {
    grad.load(gn);
    const int64_t sh = p.strideH, sw = p.strideW, wq = grad.wq;
    for (const Phase& ph : phases) {
      const auto depth = static_cast<int64_t>(ph.offsets.size());
      const int64_t n = ph.rows * wq;
      wide.resize(static_cast<size_t>(g.c * n));
      if (depth > 0)  // a phase that no tap reaches (kernel smaller than the stride) gets zeros
        detail::gemmShiftedB(g.c, n, depth, ph.weight.data(), depth, grad.values.data(), ph.offsets.data(),
                             wide.data(), n);
      else
        std::fill(wide.begin(), wide.end(), 0.0f);
      // Padded row s u + a is input row s u + a - pad: the phase's rows and columns inside.
      const int64_t u0 = std::max<int64_t>(0, ceilDiv(p.padH - ph.a, sh));
      const int64_t u1 = std::min(ph.rows, ceilDiv(g.h + p.padH - ph.a, sh));
      const int64_t v0 = std::max<int64_t>(0, ceilDiv(p.padW - ph.b, sw));
      const int64_t v1 = ceilDiv(g.w + p.padW - ph.b, sw);
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t u = u0; u < u1; ++u) {
          const float* src = wide.data() + c * n + u * wq;
          float* dst = dx + (c * g.h + sh * u + ph.a - p.padH) * g.w + ph.b - p.padW;
          for (int64_t v = v0; v < v1; ++v) dst[v * sw] = src[v];
        }
    }
  }
};

}  // namespace

Tensor conv2dForward(const Tensor& x0, const Tensor& w0, const Tensor& bias, const Conv2dParams& p) {
  const ConvGeometry g = convGeometry(x0, w0, p);
  Tensor x = x0.contiguous(), w = w0.contiguous();
  KOLO_CHECK(x.dtype() == w.dtype(), "conv2d: dtypes ", dtypeName(x.dtype()), " and ", dtypeName(w.dtype()));
  if (bias.defined())
    KOLO_CHECK(bias.dim() == 1 && bias.shape()[0] == g.o, "conv2d: bias ", shapeString(bias.shape()),
               " for ", g.o, " output channels");
  Tensor out = Tensor::empty({g.n, g.o, g.oh, g.ow}, x.dtype());
  const int64_t ckk = g.c * g.kh * g.kw, spatial = g.oh * g.ow;
  const bool pointwise = isPointwise(g, p);
  if (x.dtype() == DType::F32 && shiftedRows(g, p)) {
    BorderedImage image(g.c, g.h, g.w, p.padH, p.padW, g.h + 2 * p.padH, g.w + 2 * p.padW, p.strideH, p.strideW,
                        g.kh, g.kw);
    const std::vector<int64_t> offsets = image.kernelOffsets();
    std::vector<float> wide;
    const Tensor b = bias.defined() ? bias.to(DType::F32).contiguous() : Tensor();
    for (int64_t n = 0; n < g.n; ++n) {
      image.load(x.data<float>() + n * g.c * g.h * g.w);
      shiftedConv(image, offsets, w.data<float>(), g.o, g.oh, g.ow, b.defined() ? b.data<float>() : nullptr, wide,
                  out.data<float>() + n * g.o * spatial);
    }
    return out;
  }
  detail::dispatchFloat(x.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(ckk * spatial));
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    T* po = out.data<T>();
    Tensor b = bias.defined() ? bias.to(x.dtype()).contiguous() : Tensor();
    for (int64_t n = 0; n < g.n; ++n) {
      T* on = po + n * g.o * spatial;
      // The GEMM accumulates onto the bias rows (beta = 1) instead of a second pass.
      T beta = T(0);
      if (b.defined()) {
        const T* pb = b.data<T>();
        for (int64_t o = 0; o < g.o; ++o) std::fill(on + o * spatial, on + (o + 1) * spatial, pb[o]);
        beta = T(1);
      }
      const T* xn = px + n * g.c * g.h * g.w;
      if (!pointwise) im2col(xn, g, p, col.data());
      // out_n [O, S] = W [O, CKK] @ col_n [CKK, S]
      detail::gemm<T>(CblasNoTrans, CblasNoTrans, g.o, spatial, ckk, T(1), pw, ckk, pointwise ? xn : col.data(),
                      spatial, beta, on, spatial);
    }
  });
  return out;
}

namespace {

// conv2dBackward of an f32 convolution through shifted rows (see shiftedConv): per image, the
// weight's gradient transposed, dW^T [C kh kw, O] += rows (c, i, j) of the bordered image
// [., oh wq] @ g^T [oh wq, O] (g's extra columns zero), and the input's gradient, with stride
// 1, as the convolution of g, bordered by k - 1 - p, with the flipped, transposed kernel,
// else phase by phase (StridedInputGrad).
void shiftedBackward(const ConvGeometry& g, const Conv2dParams& p, const Tensor& grad, const Tensor& x,
                     const Tensor& w, Tensor* gradX, Tensor* gradW, Tensor* gradB) {
  const int64_t spatial = g.oh * g.ow, imageSize = g.c * g.h * g.w, ckk = g.c * g.kh * g.kw;
  const bool strided = p.strideH > 1 || p.strideW > 1;
  const float* pg = grad.data<float>();
  std::optional<BorderedImage> image, gradImage;
  std::optional<StridedInputGrad> stridedGrad;
  std::vector<int64_t> offsets, gradOffsets;
  std::vector<float> gradT, weightT, flipped, wide;
  if (gradW) {
    image.emplace(g.c, g.h, g.w, p.padH, p.padW, g.h + 2 * p.padH, g.w + 2 * p.padW, p.strideH, p.strideW, g.kh,
                  g.kw);
    offsets = image->kernelOffsets();
    gradT.assign(static_cast<size_t>(g.oh * image->wq * g.o), 0.0f);  // extra columns stay 0
    weightT.assign(static_cast<size_t>(ckk * g.o), 0.0f);
  }
  if (gradX && strided) {
    stridedGrad.emplace(g, p, w.data<float>());
  } else if (gradX) {
    const int64_t bh = g.kh - 1 - p.padH, bw = g.kw - 1 - p.padW;
    gradImage.emplace(g.o, g.oh, g.ow, bh, bw, g.oh + 2 * bh, g.ow + 2 * bw, 1, 1, g.kh, g.kw);
    gradOffsets = gradImage->kernelOffsets();
    flipped = flippedTransposed(w.data<float>(), g);
  }
  for (int64_t n = 0; n < g.n; ++n) {
    const float* gn = pg + n * g.o * spatial;  // (O, oh, ow)
    if (gradB) {
      float* pb = gradB->data<float>();
      for (int64_t o = 0; o < g.o; ++o) pb[o] += sumContiguous(gn + o * spatial, spatial);
    }
    if (gradW) {
      image->load(x.data<float>() + n * imageSize);
      transposeRows(gn, g.o, g.oh, g.ow, image->wq, gradT.data());
      detail::gemmShiftedA(ckk, g.o, g.oh * image->wq, image->values.data(), offsets.data(), gradT.data(), g.o,
                           weightT.data(), g.o);
    }
    if (stridedGrad) {
      stridedGrad->run(gn, gradX->data<float>() + n * imageSize);
    } else if (gradX) {
      gradImage->load(gn);
      shiftedConv(*gradImage, gradOffsets, flipped.data(), g.c, g.h, g.w, nullptr, wide,
                  gradX->data<float>() + n * imageSize);
    }
  }
  if (gradW) {
    float* dw = gradW->data<float>();
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t k = 0; k < ckk; ++k) dw[o * ckk + k] = weightT[static_cast<size_t>(k * g.o + o)];
  }
}

}  // namespace

void conv2dBackward(const Tensor& grad0, const Tensor& x0, const Tensor& w0, const Conv2dParams& p,
                    Tensor* gradX, Tensor* gradW, Tensor* gradB) {
  const ConvGeometry g = convGeometry(x0, w0, p);
  // x only for the weight's gradient, w only for the input's: the other may have no storage.
  Tensor x = gradW ? x0.contiguous() : x0, w = gradX ? w0.contiguous() : w0, grad = grad0.contiguous();
  KOLO_CHECK(grad.shape() == (Shape{g.n, g.o, g.oh, g.ow}), "conv2d backward: gradient ",
             shapeString(grad.shape()), " for output [", g.n, ", ", g.o, ", ", g.oh, ", ", g.ow, "]");
  const int64_t ckk = g.c * g.kh * g.kw, spatial = g.oh * g.ow, imageSize = g.c * g.h * g.w;
  const bool pointwise = isPointwise(g, p);
  if (gradX) *gradX = Tensor::empty(x.shape(), x.dtype());
  if (gradW) *gradW = Tensor::zeros(w.shape(), w.dtype());
  if (gradB) *gradB = Tensor::zeros({g.o}, w.dtype());
  const bool strided = p.strideH > 1 || p.strideW > 1;
  if (grad.dtype() == DType::F32 && shiftedRows(g, p) &&
      (strided || (g.kh - 1 - p.padH >= 0 && g.kw - 1 - p.padW >= 0))) {
    shiftedBackward(g, p, grad, x, w, gradX, gradW, gradB);
    return;
  }
  detail::dispatchFloat(x.dtype(), "conv2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(ckk * spatial));
    const T* px = gradW ? x.data<T>() : nullptr;
    const T* pw = gradX ? w.data<T>() : nullptr;
    const T* pg = grad.data<T>();
    for (int64_t n = 0; n < g.n; ++n) {
      const T* gn = pg + n * g.o * spatial;  // (O, S)
      if (gradB) {
        T* pb = gradB->data<T>();
        for (int64_t o = 0; o < g.o; ++o) pb[o] += sumContiguous(gn + o * spatial, spatial);
      }
      if (gradW) {
        const T* xn = px + n * imageSize;
        if (!pointwise) im2col(xn, g, p, col.data());
        // dW [O, CKK] += g_n [O, S] @ col_n^T [S, CKK]
        detail::gemm<T>(CblasNoTrans, CblasTrans, g.o, ckk, spatial, T(1), gn, spatial, pointwise ? xn : col.data(),
                        spatial, T(1), gradW->data<T>(), ckk);
      }
      if (gradX) {
        T* dxn = gradX->data<T>() + n * imageSize;
        // dcol [CKK, S] = W^T [CKK, O] @ g_n [O, S]; a pointwise conv's dcol is dx itself.
        detail::gemm<T>(CblasTrans, CblasNoTrans, ckk, spatial, g.o, T(1), pw, ckk, gn, spatial, T(0),
                        pointwise ? dxn : col.data(), spatial);
        if (!pointwise) {
          std::memset(dxn, 0, sizeof(T) * imageSize);
          col2im(col.data(), g, p, dxn);
        }
      }
    }
  });
}

}  // namespace kolo::kernels
