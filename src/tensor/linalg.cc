// GEMM-backed kernels: 2-d and batched matmul through CBLAS (transposed views are passed
// as BLAS transpose flags, not copied), convolution as im2col + GEMM, and max-pooling.
#include <cblas.h>

#include <cstring>
#include <limits>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"

namespace kolo::kernels {

namespace {

// How a 2-d operand is handed to BLAS: the base pointer view, transpose flag, leading dim.
struct GemmOperand {
  Tensor t;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 0;
};

GemmOperand gemmOperand(const Tensor& x) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
  if ((s1 == 1 || cols == 1) && s0 >= std::max<int64_t>(cols, 1)) return {x, CblasNoTrans, s0};
  if ((s0 == 1 || rows == 1) && s1 >= std::max<int64_t>(rows, 1)) return {x, CblasTrans, s1};
  Tensor c = x.contiguous();
  return {c, CblasNoTrans, std::max<int64_t>(cols, 1)};
}

template <class T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace

Tensor matmul2d(const Tensor& a, const Tensor& b, Tensor* out, double beta) {
  KOLO_CHECK(a.dim() == 2 && b.dim() == 2 && a.shape()[1] == b.shape()[0], "matmul: shapes ",
             shapeString(a.shape()), " and ", shapeString(b.shape()), " are not aligned");
  KOLO_CHECK(a.dtype() == b.dtype(), "matmul: dtypes ", dtypeName(a.dtype()), " and ", dtypeName(b.dtype()));
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor c;
  if (out && out->defined()) {
    KOLO_CHECK(out->shape() == (Shape{m, n}) && out->isContiguous() && out->dtype() == a.dtype(),
               "matmul: output of shape ", shapeString(out->shape()), " cannot hold the [", m, ", ", n,
               "] result");
    c = *out;
  } else {
    c = Tensor::empty({m, n}, a.dtype());
    beta = 0.0;
  }
  if (m == 0 || n == 0) return c;
  if (k == 0) {
    if (beta == 0.0) c.fill(0.0);
    else scaleInPlace(c, beta);
    return c;
  }
  GemmOperand ga = gemmOperand(a), gb = gemmOperand(b);
  detail::dispatchFloat(a.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gemm<T>(ga.trans, gb.trans, m, n, k, T(1), ga.t.template data<T>(), ga.ld, gb.t.template data<T>(), gb.ld,
            static_cast<T>(beta), c.template data<T>(), n);
  });
  if (out) *out = c;
  return c;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  KOLO_CHECK(a.dim() == 3 && b.dim() == 3 && a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1],
             "bmm: shapes ", shapeString(a.shape()), " and ", shapeString(b.shape()), " are not aligned");
  const int64_t batch = a.shape()[0], m = a.shape()[1], n = b.shape()[2];
  Tensor c = Tensor::empty({batch, m, n}, a.dtype());
  for (int64_t i = 0; i < batch; ++i) {
    Tensor ci = sliceRaw(c, 0, i, i + 1, 1);
    ci = viewRaw(ci, {m, n});
    Tensor ai = squeezeRaw(sliceRaw(a, 0, i, i + 1, 1), 0);
    Tensor bi = squeezeRaw(sliceRaw(b, 0, i, i + 1, 1), 0);
    matmul2d(ai, bi, &ci, 0.0);
  }
  return c;
}

// ---------------------------------------------------------------- convolution

namespace {

struct ConvGeometry {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
};

ConvGeometry convGeometry(const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  KOLO_CHECK(x.dim() == 4, "conv2d: input must be [N, C, H, W], got ", shapeString(x.shape()));
  KOLO_CHECK(w.dim() == 4, "conv2d: weight must be [O, C, kh, kw], got ", shapeString(w.shape()));
  KOLO_CHECK(x.shape()[1] == w.shape()[1], "conv2d: input ", shapeString(x.shape()), " has ", x.shape()[1],
             " channels but weight ", shapeString(w.shape()), " expects ", w.shape()[1]);
  ConvGeometry g{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], w.shape()[0], w.shape()[2], w.shape()[3], 0, 0};
  g.oh = (g.h + 2 * p.padH - g.kh) / p.strideH + 1;
  g.ow = (g.w + 2 * p.padW - g.kw) / p.strideW + 1;
  KOLO_CHECK(g.oh > 0 && g.ow > 0, "conv2d: kernel ", g.kh, "x", g.kw, " larger than padded input ",
             shapeString(x.shape()));
  return g;
}

// col [C*kh*kw, oh*ow] from one image [C, H, W].
template <class T>
void im2col(const T* img, const ConvGeometry& g, const Conv2dParams& p, T* col) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* row = col + ((c * g.kh + ki) * g.kw + kj) * g.oh * g.ow;
        for (int64_t y = 0; y < g.oh; ++y) {
          const int64_t iy = y * p.strideH - p.padH + ki;
          T* dst = row + y * g.ow;
          if (iy < 0 || iy >= g.h) {
            for (int64_t x = 0; x < g.ow; ++x) dst[x] = T(0);
            continue;
          }
          const T* src = img + (c * g.h + iy) * g.w;
          if (p.strideW == 1 && p.padW == 0) {
            std::memcpy(dst, src + kj, sizeof(T) * g.ow);
            continue;
          }
          for (int64_t x = 0; x < g.ow; ++x) {
            const int64_t ix = x * p.strideW - p.padW + kj;
            dst[x] = (ix >= 0 && ix < g.w) ? src[ix] : T(0);
          }
        }
      }
}

// Adds col [C*kh*kw, oh*ow] back into image [C, H, W] (the adjoint of im2col).
template <class T>
void col2im(const T* col, const ConvGeometry& g, const Conv2dParams& p, T* img) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const T* row = col + ((c * g.kh + ki) * g.kw + kj) * g.oh * g.ow;
        for (int64_t y = 0; y < g.oh; ++y) {
          const int64_t iy = y * p.strideH - p.padH + ki;
          if (iy < 0 || iy >= g.h) continue;
          T* dst = img + (c * g.h + iy) * g.w;
          const T* src = row + y * g.ow;
          if (p.strideW == 1 && p.padW == 0) {
            T* d = dst + kj;
            for (int64_t x = 0; x < g.ow; ++x) d[x] += src[x];
            continue;
          }
          for (int64_t x = 0; x < g.ow; ++x) {
            const int64_t ix = x * p.strideW - p.padW + kj;
            if (ix >= 0 && ix < g.w) dst[ix] += src[x];
          }
        }
      }
}

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
  detail::dispatchFloat(x.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> col(static_cast<size_t>(ckk * spatial));
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    T* po = out.data<T>();
    Tensor b = bias.defined() ? bias.contiguous() : Tensor();
    for (int64_t n = 0; n < g.n; ++n) {
      T* on = po + n * g.o * spatial;
      T beta = T(0);
      if (b.defined()) {
        const T* pb = b.data<T>();
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t s = 0; s < spatial; ++s) on[o * spatial + s] = pb[o];
        beta = T(1);
      }
      const T* xn = px + n * g.c * g.h * g.w;
      const bool direct = g.kh == 1 && g.kw == 1 && p.strideH == 1 && p.strideW == 1 && p.padH == 0 && p.padW == 0;
      if (!direct) im2col(xn, g, p, col.data());
      gemm<T>(CblasNoTrans, CblasNoTrans, g.o, spatial, ckk, T(1), pw, ckk, direct ? xn : col.data(), spatial,
              beta, on, spatial);
    }
  });
  return out;
}

void conv2dBackward(const Tensor& grad0, const Tensor& x0, const Tensor& w0, const Conv2dParams& p,
                    Tensor* gradX, Tensor* gradW, Tensor* gradB) {
  const ConvGeometry g = convGeometry(x0, w0, p);
  Tensor x = x0.contiguous(), w = w0.contiguous(), grad = grad0.contiguous();
  const int64_t ckk = g.c * g.kh * g.kw, spatial = g.oh * g.ow;
  if (gradX) *gradX = Tensor::zeros(x.shape(), x.dtype());
  if (gradW) *gradW = Tensor::zeros(w.shape(), w.dtype());
  if (gradB) *gradB = Tensor::zeros({g.o}, w.dtype());
  detail::dispatchFloat(x.dtype(), "conv2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> col(static_cast<size_t>(ckk * spatial));
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    const T* pg = grad.data<T>();
    for (int64_t n = 0; n < g.n; ++n) {
      const T* gn = pg + n * g.o * spatial;
      if (gradB) {
        T* pb = gradB->data<T>();
        for (int64_t o = 0; o < g.o; ++o) {
          T acc = T(0);
          for (int64_t s = 0; s < spatial; ++s) acc += gn[o * spatial + s];
          pb[o] += acc;
        }
      }
      if (gradW) {
        im2col(px + n * g.c * g.h * g.w, g, p, col.data());
        // dW [O, CKK] += g_n [O, S] @ col^T [S, CKK]
        gemm<T>(CblasNoTrans, CblasTrans, g.o, ckk, spatial, T(1), gn, spatial, col.data(), spatial, T(1),
                gradW->data<T>(), ckk);
      }
      if (gradX) {
        // dcol [CKK, S] = W^T [CKK, O] @ g_n [O, S]
        gemm<T>(CblasTrans, CblasNoTrans, ckk, spatial, g.o, T(1), pw, ckk, gn, spatial, T(0), col.data(), spatial);
        col2im(col.data(), g, p, gradX->data<T>() + n * g.c * g.h * g.w);
      }
    }
  });
}

// ---------------------------------------------------------------- max pooling

Tensor maxPool2dForward(const Tensor& x0, int64_t k, int64_t s, int64_t pad, Tensor* indices) {
  KOLO_CHECK(x0.dim() == 4, "maxPool2d: input must be [N, C, H, W], got ", shapeString(x0.shape()));
  KOLO_CHECK(k > 0 && s > 0 && pad >= 0 && 2 * pad <= k, "maxPool2d: kernel ", k, ", stride ", s, ", padding ", pad);
  Tensor x = x0.contiguous();
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  KOLO_CHECK(oh > 0 && ow > 0, "maxPool2d: kernel ", k, " larger than input ", shapeString(x.shape()));
  Tensor out = Tensor::empty({n, c, oh, ow}, x.dtype());
  Tensor idx = Tensor::empty({n, c, oh, ow}, DType::I32);
  detail::dispatchFloat(x.dtype(), "maxPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int32_t* pi = idx.data<int32_t>();
    for (int64_t plane = 0; plane < n * c; ++plane) {
      const T* in = px + plane * h * w;
      T* o = po + plane * oh * ow;
      int32_t* oi = pi + plane * oh * ow;
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          T best = -std::numeric_limits<T>::infinity();
          int32_t arg = -1;
          for (int64_t ki = 0; ki < k; ++ki) {
            const int64_t iy = y * s - pad + ki;
            if (iy < 0 || iy >= h) continue;
            for (int64_t kj = 0; kj < k; ++kj) {
              const int64_t ix = xx * s - pad + kj;
              if (ix < 0 || ix >= w) continue;
              const T v = in[iy * w + ix];
              if (v > best || arg < 0 || v != v) {
                best = v;
                arg = static_cast<int32_t>(iy * w + ix);
                if (v != v) break;
              }
            }
          }
          o[y * ow + xx] = best;
          oi[y * ow + xx] = arg;
        }
    }
  });
  if (indices) *indices = idx;
  return out;
}

Tensor maxPool2dBackward(const Tensor& grad0, const Tensor& indices, const Shape& xShape) {
  Tensor grad = grad0.contiguous();
  Tensor out = Tensor::zeros(xShape, grad.dtype());
  const int64_t planes = xShape[0] * xShape[1], hw = xShape[2] * xShape[3];
  const int64_t ohw = grad.shape()[2] * grad.shape()[3];
  detail::dispatchFloat(grad.dtype(), "maxPool2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = grad.data<T>();
    const int32_t* pi = indices.data<int32_t>();
    T* po = out.data<T>();
    for (int64_t plane = 0; plane < planes; ++plane)
      for (int64_t i = 0; i < ohw; ++i) po[plane * hw + pi[plane * ohw + i]] += pg[plane * ohw + i];
  });
  return out;
}

}  // namespace kolo::kernels
