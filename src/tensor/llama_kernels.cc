// Kernels of the blocks of LLaMA-style transformers: RMSNorm over rows, SiLU and the SwiGLU
// gate silu(gate) * up, each forward and backward in one pass, and rotary position embeddings
// (RoPE) on the heads of a (B, T, H*d) projection. f32 rows keep 16 partial sums (as
// row_kernels.cc does) and are compiled for AVX-512, AVX2 and the baseline; f64 runs the same
// loops for gradient checks.
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"
#include "tensor/vector_math.h"

namespace kolo::kernels {

namespace {

constexpr int kLanes = 16;

template <class T>
inline T expOf(T x) {
  if constexpr (std::is_same_v<T, float>) return detail::expApprox(x);
  else return std::exp(x);
}

template <class T>
inline T sigmoidOf(T x) {
  return T(1) / (T(1) + expOf<T>(-x));
}

// Sum of x[i] * y[i] over n elements in kLanes partial sums.
template <class T>
[[gnu::always_inline]] inline T dotLanes(const T* __restrict x, const T* __restrict y, int64_t n) {
  const int64_t whole = n / kLanes * kLanes;
  T lanes[kLanes] = {};
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l] * y[i + l];
  T total = 0;
  for (int l = 0; l < kLanes; ++l) total += lanes[l];
  for (int64_t i = whole; i < n; ++i) total += x[i] * y[i];
  return total;
}

// y = x * rstd * w per row of n; rstd[row] = 1 / sqrt(mean(x^2) + eps).
template <class T>
[[gnu::always_inline]] inline void rmsNormRowsOf(const T* __restrict x, const T* __restrict w, T* __restrict y,
                                                 T* __restrict rstd, int64_t rows, int64_t n, double eps) {
  for (int64_t row = 0; row < rows; ++row) {
    const T* in = x + row * n;
    T* out = y + row * n;
    const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(dotLanes(in, in, n)) / n + eps));
    rstd[row] = r;
    if (w) {
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] * r * w[i];
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] * r;
    }
  }
}

// With u = g * w (g where w is null): gx = r (u - x r^2 mean(u x)) overwritten, gw += g x r.
template <class T>
[[gnu::always_inline]] inline void rmsNormBackwardRowsOf(const T* __restrict grad, const T* __restrict x,
                                                         const T* __restrict w, const T* __restrict rstd,
                                                         int64_t rows, int64_t n, T* __restrict gx,
                                                         T* __restrict gw) {
  for (int64_t row = 0; row < rows; ++row) {
    const T* g = grad + row * n;
    const T* in = x + row * n;
    const T r = rstd[row];
    if (gx) {
      T* out = gx + row * n;
      const int64_t whole = n / kLanes * kLanes;
      T lanes[kLanes] = {};
      for (int64_t i = 0; i < whole; i += kLanes)
        for (int l = 0; l < kLanes; ++l) lanes[l] += g[i + l] * (w ? w[i + l] : T(1)) * in[i + l];
      T dot = 0;
      for (int l = 0; l < kLanes; ++l) dot += lanes[l];
      for (int64_t i = whole; i < n; ++i) dot += g[i] * (w ? w[i] : T(1)) * in[i];
      const T c = r * r * r * dot / static_cast<T>(n);
      for (int64_t i = 0; i < n; ++i) out[i] = r * g[i] * (w ? w[i] : T(1)) - c * in[i];
    }
    if (gw)
      for (int64_t i = 0; i < n; ++i) gw[i] += g[i] * in[i] * r;
  }
}

// out = silu(gate) * up over n elements (up null: silu(gate)).
template <class T>
[[gnu::always_inline]] inline void swigluOf(const T* __restrict gate, const T* __restrict up, T* __restrict out,
                                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T a = gate[i] * sigmoidOf(gate[i]);
    out[i] = up ? a * up[i] : a;
  }
}

// dgate = g * up * silu'(gate), with silu'(x) = s (1 + x (1 - s)), s = sigmoid(x); dup = g *
// silu(gate) (up null: the SiLU's gradient alone, dup unused).
template <class T>
[[gnu::always_inline]] inline void swigluBackwardOf(const T* __restrict grad, const T* __restrict gate,
                                                    const T* __restrict up, T* __restrict dgate, T* __restrict dup,
                                                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = gate[i], s = sigmoidOf(x);
    const T gu = up ? grad[i] * up[i] : grad[i];
    dgate[i] = gu * s * (T(1) + x * (T(1) - s));
    if (dup) dup[i] = grad[i] * x * s;
  }
}

KOLO_VECTOR_CLONES void rmsNormRowsF32(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                                       int64_t n, double eps) {
  rmsNormRowsOf(x, w, y, rstd, rows, n, eps);
}
KOLO_VECTOR_CLONES void rmsNormBackwardRowsF32(const float* grad, const float* x, const float* w, const float* rstd,
                                               int64_t rows, int64_t n, float* gx, float* gw) {
  rmsNormBackwardRowsOf(grad, x, w, rstd, rows, n, gx, gw);
}
KOLO_VECTOR_CLONES void swigluF32(const float* gate, const float* up, float* out, int64_t n) {
  swigluOf(gate, up, out, n);
}
KOLO_VECTOR_CLONES void swigluBackwardF32(const float* grad, const float* gate, const float* up, float* dgate,
                                          float* dup, int64_t n) {
  swigluBackwardOf(grad, gate, up, dgate, dup, n);
}

template <class T>
const T* dataOrNull(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

Tensor rmsNormForward(const Tensor& x0, const Tensor& weight, double eps, Tensor* rstd) {
  Tensor x = x0.contiguous();
  KOLO_CHECK(x.dim() >= 1 && x.shape().back() > 0, "rmsNorm: input ", shapeString(x.shape()), " has no features");
  const int64_t n = x.shape().back(), rows = x.numel() / n;
  Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype()), r = Tensor::empty({rows}, x.dtype());
  detail::dispatchFloat(x.dtype(), "rmsNorm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>)
      rmsNormRowsF32(x.data<T>(), dataOrNull<T>(w), y.data<T>(), r.data<T>(), rows, n, eps);
    else
      rmsNormRowsOf(x.data<T>(), dataOrNull<T>(w), y.data<T>(), r.data<T>(), rows, n, eps);
  });
  if (rstd) *rstd = r;
  return y;
}

void rmsNormBackward(const Tensor& grad0, const Tensor& x0, const Tensor& weight, const Tensor& rstd,
                     Tensor* gradX, Tensor* gradW) {
  Tensor x = x0.contiguous(), grad = grad0.contiguous();
  const int64_t n = x.shape().back(), rows = x.numel() / n;
  Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  Tensor gx = gradX ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  Tensor gw = gradW ? Tensor::zeros({n}, x.dtype()) : Tensor();
  detail::dispatchFloat(x.dtype(), "rmsNorm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pgx = gx.defined() ? gx.data<T>() : nullptr;
    T* pgw = gw.defined() ? gw.data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>)
      rmsNormBackwardRowsF32(grad.data<T>(), x.data<T>(), dataOrNull<T>(w), rstd.data<T>(), rows, n, pgx, pgw);
    else
      rmsNormBackwardRowsOf(grad.data<T>(), x.data<T>(), dataOrNull<T>(w), rstd.data<T>(), rows, n, pgx, pgw);
  });
  if (gradX) *gradX = gx;
  if (gradW) *gradW = gw;
}

Tensor swigluForward(const Tensor& gate0, const Tensor& up0) {
  Tensor gate = gate0.contiguous(), up = up0.defined() ? up0.contiguous() : Tensor();
  Tensor out = Tensor::empty(gate.shape(), gate.dtype());
  detail::dispatchFloat(gate.dtype(), "swiglu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) swigluF32(gate.data<T>(), dataOrNull<T>(up), out.data<T>(), out.numel());
    else swigluOf(gate.data<T>(), dataOrNull<T>(up), out.data<T>(), out.numel());
  });
  return out;
}

void swigluBackward(const Tensor& grad0, const Tensor& gate0, const Tensor& up0, Tensor* gradGate, Tensor* gradUp) {
  Tensor grad = grad0.contiguous(), gate = gate0.contiguous(), up = up0.defined() ? up0.contiguous() : Tensor();
  Tensor dg = Tensor::empty(gate.shape(), gate.dtype());
  Tensor du = up.defined() && gradUp ? Tensor::empty(gate.shape(), gate.dtype()) : Tensor();
  detail::dispatchFloat(gate.dtype(), "swiglu backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pdu = du.defined() ? du.data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>)
      swigluBackwardF32(grad.data<T>(), gate.data<T>(), dataOrNull<T>(up), dg.data<T>(), pdu, dg.numel());
    else
      swigluBackwardOf(grad.data<T>(), gate.data<T>(), dataOrNull<T>(up), dg.data<T>(), pdu, dg.numel());
  });
  if (gradGate) *gradGate = dg;
  if (gradUp) *gradUp = du;
}

Tensor rotaryForward(const Tensor& x0, int64_t headDim, double theta, int64_t offset, bool inverse) {
  KOLO_REQUIRE(x0.dim() == 3 && headDim > 0 && headDim % 2 == 0 && x0.shape()[2] % headDim == 0,
               "rotary position embedding: input ", shapeString(x0.shape()), " is not (B, T, H*d) with an even d = ",
               headDim);
  KOLO_REQUIRE(theta > 0.0 && offset >= 0, "rotary position embedding: base ", theta, " and position offset ",
               offset, " must be positive and at least 0");
  Tensor x = x0.contiguous();
  const int64_t b = x.shape()[0], t = x.shape()[1], width = x.shape()[2], half = headDim / 2;
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), "rotary position embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // cos and sin of position p's angle p * theta^(-2i/d) for pair i, (T, d/2) each; the
    // inverse rotation (backward's) is the rotation by minus the angle.
    std::vector<T> cosines(static_cast<size_t>(t * half)), sines(cosines.size());
    for (int64_t p = 0; p < t; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p + offset) *
                             std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(headDim));
        cosines[static_cast<size_t>(p * half + i)] = static_cast<T>(std::cos(angle));
        sines[static_cast<size_t>(p * half + i)] = static_cast<T>(inverse ? -std::sin(angle) : std::sin(angle));
      }
    const T* in = x.data<T>();
    T* o = out.data<T>();
    for (int64_t row = 0; row < b * t; ++row) {
      const T* c = cosines.data() + (row % t) * half;
      const T* s = sines.data() + (row % t) * half;
      for (int64_t h = 0; h < width; h += headDim) {
        const T* xr = in + row * width + h;
        T* yr = o + row * width + h;
        // Pair i is the elements (2i, 2i+1), rotated as the complex number x_2i + i x_2i+1
        // times e^(i angle) (Meta's LLaMA and torchtitan's apply_rotary_emb).
        for (int64_t i = 0; i < half; ++i) {
          const T a = xr[2 * i], bb = xr[2 * i + 1];
          yr[2 * i] = a * c[i] - bb * s[i];
          yr[2 * i + 1] = a * s[i] + bb * c[i];
        }
      }
    }
  });
  return out;
}

}  // namespace kolo::kernels
