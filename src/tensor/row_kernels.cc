// Vectorised f32 row loops of a transformer step (row_kernels.h). Reductions along a row keep
// 16 partial sums (one AVX-512 vector) so that the compiler vectorises them without being
// allowed to reorder floating-point sums itself.
#include "tensor/row_kernels.h"

#include <algorithm>
#include <cmath>

#include "tensor/vector_avx512.h"
#include "tensor/vector_math.h"

namespace kolo::detail {

namespace {

constexpr int kLanes = 16;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// GELU's derivative Phi(v) + v phi(v): erf(v / sqrt 2) needs e^(-v^2 / 2), which is also the
// density's, so one exponential serves both.
inline float geluDerivative(float v) {
  const float e = expApprox(-0.5f * v * v);
  return 0.5f * (1.0f + erfFromExp(v * kInvSqrt2, e)) + v * kInvSqrt2Pi * e;
}

}  // namespace

KOLO_VECTOR_CLONES void geluRowsPortable(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erfApprox(x[i] * kInvSqrt2));
}

KOLO_VECTOR_CLONES void geluBackwardRowsPortable(const float* __restrict grad, const float* __restrict x,
                                         float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = grad[i] * geluDerivative(x[i]);
  }
}

KOLO_VECTOR_CLONES void biasGeluRowsPortable(float* __restrict pre, const float* __restrict bias, float* __restrict y,
                                     int64_t rows, int64_t n) {
  for (int64_t row = 0; row < rows; ++row) {
    float* p = pre + row * n;
    float* out = y + row * n;
    for (int64_t i = 0; i < n; ++i) {
      const float v = p[i] + bias[i];
      p[i] = v;
      out[i] = 0.5f * v * (1.0f + erfApprox(v * kInvSqrt2));
    }
  }
}

KOLO_VECTOR_CLONES void geluBackwardBiasRowsPortable(const float* __restrict grad, const float* __restrict pre,
                                             float* __restrict gpre, float* __restrict gbias, int64_t rows,
                                             int64_t n) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* g = grad + row * n;
    const float* p = pre + row * n;
    float* out = gpre + row * n;
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] * geluDerivative(p[i]);
      out[i] = d;
      gbias[i] += d;
    }
  }
}

#ifdef KOLO_HAVE_VECTOR_AVX512
namespace {

// The mask of the first min(16, n - i) lanes: none from n on.
inline __mmask16 lanesFrom(int64_t i, int64_t n) {
  if (n - i >= kLanes) return static_cast<__mmask16>(0xFFFF);
  return n <= i ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << (n - i)) - 1);
}

KOLO_VECTOR_AVX512 void geluRowsAvx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = lanesFrom(i, n);
    _mm512_mask_storeu_ps(y + i, m, geluVector(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

KOLO_VECTOR_AVX512 void geluBackwardRowsAvx512(const float* grad, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = lanesFrom(i, n);
    const __m512 d = geluDerivativeVector(_mm512_maskz_loadu_ps(m, x + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, grad + i), d));
  }
}

KOLO_VECTOR_AVX512 void biasGeluRowsAvx512(float* pre, const float* bias, float* y, int64_t rows, int64_t n) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 m = lanesFrom(i, n);
      float* p = pre + row * n + i;
      const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), _mm512_maskz_loadu_ps(m, bias + i));
      _mm512_mask_storeu_ps(p, m, v);
      _mm512_mask_storeu_ps(y + row * n + i, m, geluVector(v));
    }
}

KOLO_VECTOR_AVX512 void geluBackwardBiasRowsAvx512(const float* grad, const float* pre, float* gpre, float* gbias,
                                                 int64_t rows, int64_t n) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 m = lanesFrom(i, n);
      const int64_t at = row * n + i;
      const __m512 d = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, grad + at),
                                     geluDerivativeVector(_mm512_maskz_loadu_ps(m, pre + at)));
      _mm512_mask_storeu_ps(gpre + at, m, d);
      _mm512_mask_storeu_ps(gbias + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, gbias + i), d));
    }
}

// LayerNorm of each row in 16-lane vectors, the portable loop's two passes (the mean, then
// the centred squares) with each sum in two accumulators folded as a tree (sumLanes).
KOLO_VECTOR_AVX512 void layerNormRowsAvx512(const float* x, const float* w, const float* b, float* y, float* mean,
                                            float* rstd, int64_t rows, int64_t n, float eps) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * n;
    float* out = y + row * n;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 2 * kLanes) {
      s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(lanesFrom(i, n), in + i));
      if (i + kLanes < n) s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(lanesFrom(i + kLanes, n), in + i + kLanes));
    }
    const float mu = sumLanes(_mm512_add_ps(s0, s1)) / static_cast<float>(n);
    const __m512 muV = _mm512_set1_ps(mu);
    s0 = s1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 2 * kLanes) {
      const __mmask16 m0 = lanesFrom(i, n);
      const __m512 d0 = _mm512_maskz_sub_ps(m0, _mm512_maskz_loadu_ps(m0, in + i), muV);
      s0 = _mm512_fmadd_ps(d0, d0, s0);
      if (i + kLanes < n) {
        const __mmask16 m1 = lanesFrom(i + kLanes, n);
        const __m512 d1 = _mm512_maskz_sub_ps(m1, _mm512_maskz_loadu_ps(m1, in + i + kLanes), muV);
        s1 = _mm512_fmadd_ps(d1, d1, s1);
      }
    }
    const float rs = 1.0f / std::sqrt(sumLanes(_mm512_add_ps(s0, s1)) / static_cast<float>(n) + eps);
    mean[row] = mu;
    rstd[row] = rs;
    const __m512 rsV = _mm512_set1_ps(rs);
    for (int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 m = lanesFrom(i, n);
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, in + i), muV), rsV);
      if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
      if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b + i));
      _mm512_mask_storeu_ps(out + i, m, v);
    }
  }
}

// layerNormBackwardRows in 16-lane vectors: per row, one pass for gw, gb and the two row
// sums, one for dx.
KOLO_VECTOR_AVX512 void layerNormBackwardRowsAvx512(const float* grad, const float* x, const float* w,
                                                    const float* mean, const float* rstd, int64_t rows, int64_t n,
                                                    float* gx, float* gw, float* gb) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * n;
    const float* g = grad + row * n;
    const __m512 muV = _mm512_set1_ps(mean[row]), rsV = _mm512_set1_ps(rstd[row]);
    __m512 sumDy = _mm512_setzero_ps(), sumDyXhat = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 m = lanesFrom(i, n);
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, in + i), muV), rsV);
      if (gw) _mm512_mask_storeu_ps(gw + i, m, _mm512_fmadd_ps(gv, xhat, _mm512_maskz_loadu_ps(m, gw + i)));
      if (gb) _mm512_mask_storeu_ps(gb + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, gb + i), gv));
      const __m512 dy = w ? _mm512_mul_ps(gv, _mm512_maskz_loadu_ps(m, w + i)) : gv;
      sumDy = _mm512_add_ps(sumDy, dy);
      sumDyXhat = _mm512_fmadd_ps(dy, xhat, sumDyXhat);
    }
    if (!gx) continue;
    // dx = rs * (dy - mean(dy) - xhat * mean(dy * xhat)) with dy = g * w.
    const float invN = 1.0f / static_cast<float>(n);
    const __m512 meanDy = _mm512_set1_ps(sumLanes(sumDy) * invN);
    const __m512 meanDyXhat = _mm512_set1_ps(sumLanes(sumDyXhat) * invN);
    float* dx = gx + row * n;
    for (int64_t i = 0; i < n; i += kLanes) {
      const __mmask16 m = lanesFrom(i, n);
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
      const __m512 dy = w ? _mm512_mul_ps(gv, _mm512_maskz_loadu_ps(m, w + i)) : gv;
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, in + i), muV), rsV);
      const __m512 v = _mm512_fnmadd_ps(xhat, meanDyXhat, _mm512_sub_ps(dy, meanDy));
      _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(rsV, v));
    }
  }
}

// Rows i..i + R of causalSoftmaxRowsAvx512, side by side: a row's work is a chain of
// dependent steps (its largest score, then the exponentials and their sum, then the scale and
// the logarithm) too short to overlap with the next row's on its own; R rows interleaved give
// the core R chains at once (the default lm's 4,096 rows a layer: 164 -> 122 us). Each row's
// arithmetic is the one-row form's, in its order.
template <int R>
KOLO_VECTOR_AVX512 inline void causalSoftmaxGroup(float* s, int64_t ld, int64_t keys, int64_t visible0, float* lse,
                                                  bool fromLse) {
  float shift[R];
  if (fromLse) {
    for (int r = 0; r < R; ++r) shift[r] = lse[r];
  } else {
    __m512 mx[R];
    for (int r = 0; r < R; ++r) mx[r] = _mm512_set1_ps(-__builtin_inff());
    for (int64_t j = 0; j < visible0 + R - 1; j += kLanes)
      for (int r = 0; r < R; ++r) {
        const int64_t visible = visible0 + r;
        const __mmask16 m = lanesFrom(j, visible);
        mx[r] = _mm512_mask_max_ps(mx[r], m, mx[r], _mm512_maskz_loadu_ps(m, s + r * ld + j));
      }
    for (int r = 0; r < R; ++r) shift[r] = maxLanes(mx[r]);
  }
  // e^(s - shift) over the visible keys and 0 over the later ones, in whole vectors.
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < keys; j += kLanes) {
    const __mmask16 m = lanesFrom(j, keys);
    for (int r = 0; r < R; ++r) {
      const int64_t visible = visible0 + r;
      float* row = s + r * ld;
      const __m512 e = _mm512_maskz_mov_ps(lanesFrom(j, visible),
                                           expVectorUpTo88(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j),
                                                                   _mm512_set1_ps(shift[r]))));
      total[r] = _mm512_add_ps(total[r], e);
      _mm512_mask_storeu_ps(row + j, m, e);
    }
  }
  if (fromLse) return;
  for (int r = 0; r < R; ++r) {
    const int64_t visible = visible0 + r;
    float* row = s + r * ld;
    const float sum = sumLanes(total[r]);
    const __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (int64_t j = 0; j < visible; j += kLanes) {
      const __mmask16 m = lanesFrom(j, visible);
      _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
    }
    lse[r] = shift[r] + std::log(sum);
  }
}

// R rows of softmaxBackwardRows side by side, as causalSoftmaxGroup: a row's dot product
// P . dP ends in a fold of its 16 lanes, a chain too short to overlap with the next row's on
// its own.
template <int R>
KOLO_VECTOR_AVX512 inline void softmaxBackwardGroup(const float* p, int64_t ldp, float* dp, int64_t ldd, int64_t n,
                                                    float scale) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = lanesFrom(j, n);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p + r * ldp + j), _mm512_maskz_loadu_ps(m, dp + r * ldd + j),
                               acc[r]);
  }
  __m512 dot[R];
  for (int r = 0; r < R; ++r) dot[r] = _mm512_set1_ps(sumLanes(acc[r]));
  const __m512 scaleV = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = lanesFrom(j, n);
    for (int r = 0; r < R; ++r) {
      float* d = dp + r * ldd + j;
      const __m512 shifted = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, d), dot[r]);
      _mm512_mask_storeu_ps(d, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + r * ldp + j), shifted),
                                                scaleV));
    }
  }
}

KOLO_VECTOR_AVX512 void softmaxBackwardRowsAvx512(const float* p, int64_t ldp, float* dp, int64_t ldd, int64_t rows,
                                                  int64_t n, float scale) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) softmaxBackwardGroup<4>(p + i * ldp, ldp, dp + i * ldd, ldd, n, scale);
  for (; i < rows; ++i) softmaxBackwardGroup<1>(p + i * ldp, ldp, dp + i * ldd, ldd, n, scale);
}

KOLO_VECTOR_AVX512 void causalSoftmaxRowsAvx512(float* s, int64_t ld, int64_t rows, int64_t keys, int64_t r0,
                                                float* lse, bool fromLse) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) causalSoftmaxGroup<4>(s + i * ld, ld, keys, r0 + i + 1, lse + i, fromLse);
  for (; i < rows; ++i) causalSoftmaxGroup<1>(s + i * ld, ld, keys, r0 + i + 1, lse + i, fromLse);
}

bool hasAvx512() {
  static const bool on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return on;
}

}  // namespace

void geluRows(const float* x, float* y, int64_t n) {
  hasAvx512() ? geluRowsAvx512(x, y, n) : geluRowsPortable(x, y, n);
}

void geluBackwardRows(const float* grad, const float* x, float* out, int64_t n) {
  hasAvx512() ? geluBackwardRowsAvx512(grad, x, out, n) : geluBackwardRowsPortable(grad, x, out, n);
}

void biasGeluRows(float* pre, const float* bias, float* y, int64_t rows, int64_t n) {
  hasAvx512() ? biasGeluRowsAvx512(pre, bias, y, rows, n) : biasGeluRowsPortable(pre, bias, y, rows, n);
}

void softmaxBackwardRows(const float* p, int64_t ldp, float* dp, int64_t ldd, int64_t rows, int64_t n, float scale) {
  hasAvx512() ? softmaxBackwardRowsAvx512(p, ldp, dp, ldd, rows, n, scale)
              : softmaxBackwardRowsPortable(p, ldp, dp, ldd, rows, n, scale);
}

void causalSoftmaxRows(float* s, int64_t ld, int64_t rows, int64_t keys, int64_t r0, float* lse, bool fromLse) {
  hasAvx512() ? causalSoftmaxRowsAvx512(s, ld, rows, keys, r0, lse, fromLse)
              : causalSoftmaxRowsPortable(s, ld, rows, keys, r0, lse, fromLse);
}

void layerNormRows(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                   int64_t rows, int64_t n, float eps) {
  hasAvx512() ? layerNormRowsAvx512(x, w, b, y, mean, rstd, rows, n, eps)
              : layerNormRowsPortable(x, w, b, y, mean, rstd, rows, n, eps);
}

void layerNormBackwardRows(const float* grad, const float* x, const float* w, const float* mean,
                           const float* rstd, int64_t rows, int64_t n, float* gx, float* gw, float* gb) {
  hasAvx512() ? layerNormBackwardRowsAvx512(grad, x, w, mean, rstd, rows, n, gx, gw, gb)
              : layerNormBackwardRowsPortable(grad, x, w, mean, rstd, rows, n, gx, gw, gb);
}

void geluBackwardBiasRows(const float* grad, const float* pre, float* gpre, float* gbias, int64_t rows, int64_t n) {
  hasAvx512() ? geluBackwardBiasRowsAvx512(grad, pre, gpre, gbias, rows, n)
              : geluBackwardBiasRowsPortable(grad, pre, gpre, gbias, rows, n);
}
#else
void softmaxBackwardRows(const float* p, int64_t ldp, float* dp, int64_t ldd, int64_t rows, int64_t n, float scale) {
  softmaxBackwardRowsPortable(p, ldp, dp, ldd, rows, n, scale);
}

void causalSoftmaxRows(float* s, int64_t ld, int64_t rows, int64_t keys, int64_t r0, float* lse, bool fromLse) {
  causalSoftmaxRowsPortable(s, ld, rows, keys, r0, lse, fromLse);
}
void geluRows(const float* x, float* y, int64_t n) { geluRowsPortable(x, y, n); }
void geluBackwardRows(const float* grad, const float* x, float* out, int64_t n) {
  geluBackwardRowsPortable(grad, x, out, n);
}
void biasGeluRows(float* pre, const float* bias, float* y, int64_t rows, int64_t n) {
  biasGeluRowsPortable(pre, bias, y, rows, n);
}
void geluBackwardBiasRows(const float* grad, const float* pre, float* gpre, float* gbias, int64_t rows, int64_t n) {
  geluBackwardBiasRowsPortable(grad, pre, gpre, gbias, rows, n);
}
void layerNormRows(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                   int64_t rows, int64_t n, float eps) {
  layerNormRowsPortable(x, w, b, y, mean, rstd, rows, n, eps);
}
void layerNormBackwardRows(const float* grad, const float* x, const float* w, const float* mean,
                           const float* rstd, int64_t rows, int64_t n, float* gx, float* gw, float* gb) {
  layerNormBackwardRowsPortable(grad, x, w, mean, rstd, rows, n, gx, gw, gb);
}
#endif

KOLO_VECTOR_CLONES float rowMax(const float* x, int64_t n) {
  const int64_t whole = n / kLanes * kLanes;
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = -__builtin_inff();
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
  float mx = -__builtin_inff();
  for (int l = 0; l < kLanes; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  for (int64_t i = whole; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

KOLO_VECTOR_CLONES float expShiftedSum(const float* s, float* p, int64_t n, float shift) {
  const int64_t whole = n / kLanes * kLanes;
  float lanes[kLanes] = {};
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = expApprox(s[i + l] - shift);
      p[i + l] = e;
      lanes[l] += e;
    }
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += lanes[l];
  for (int64_t i = whole; i < n; ++i) {
    const float e = expApprox(s[i] - shift);
    p[i] = e;
    total += e;
  }
  return total;
}

KOLO_VECTOR_CLONES void softmaxBackwardRowsPortable(const float* __restrict p, int64_t ldp, float* __restrict dp,
                                                    int64_t ldd, int64_t rows, int64_t n, float scale) {
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t row = 0; row < rows; ++row) {
    const float* pr = p + row * ldp;
    float* d = dp + row * ldd;
    float lanes[kLanes] = {};
    for (int64_t i = 0; i < whole; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += pr[i + l] * d[i + l];
    float dot = 0.0f;
    for (int l = 0; l < kLanes; ++l) dot += lanes[l];
    for (int64_t i = whole; i < n; ++i) dot += pr[i] * d[i];
    for (int64_t i = 0; i < n; ++i) d[i] = pr[i] * (d[i] - dot) * scale;
  }
}

void causalSoftmaxRowsPortable(float* s, int64_t ld, int64_t rows, int64_t keys, int64_t r0, float* lse,
                               bool fromLse) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    // The later keys at -inf, so that the exponentials run over the whole row (e^-inf = 0).
    for (int64_t j = r0 + i + 1; j < keys; ++j) row[j] = -__builtin_inff();
    if (fromLse) {
      expShiftedSum(row, row, keys, lse[i]);
      continue;
    }
    const float mx = rowMax(row, keys);
    const float total = expShiftedSum(row, row, keys, mx);
    const float inv = 1.0f / total;
    for (int64_t j = 0; j < keys; ++j) row[j] *= inv;
    lse[i] = mx + std::log(total);
  }
}

KOLO_VECTOR_CLONES void expInPlace(float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = expApprox(x[i]);
}

KOLO_VECTOR_CLONES void softmaxRows(const float* __restrict x, float* __restrict y, int64_t rows, int64_t n,
                                    bool log) {
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * n;
    float* out = y + row * n;
    float lanes[kLanes];
    for (int l = 0; l < kLanes; ++l) lanes[l] = -__builtin_inff();
    for (int64_t i = 0; i < whole; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] = in[i + l] > lanes[l] ? in[i + l] : lanes[l];
    float mx = -__builtin_inff();
    for (int l = 0; l < kLanes; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    for (int64_t i = whole; i < n; ++i) mx = in[i] > mx ? in[i] : mx;
    for (int l = 0; l < kLanes; ++l) lanes[l] = 0.0f;
    for (int64_t i = 0; i < whole; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float e = expApprox(in[i + l] - mx);
        lanes[l] += e;
        out[i + l] = e;
      }
    float total = 0.0f;
    for (int l = 0; l < kLanes; ++l) total += lanes[l];
    for (int64_t i = whole; i < n; ++i) {
      const float e = expApprox(in[i] - mx);
      total += e;
      out[i] = e;
    }
    if (log) {
      const float lse = mx + std::log(total);
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] - lse;
    } else {
      const float inv = 1.0f / total;
      for (int64_t i = 0; i < n; ++i) out[i] *= inv;
    }
  }
}

KOLO_VECTOR_CLONES void layerNormRowsPortable(const float* __restrict x, const float* __restrict w,
                                      const float* __restrict b, float* __restrict y, float* __restrict mean,
                                      float* __restrict rstd, int64_t rows, int64_t n, float eps) {
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * n;
    float* out = y + row * n;
    float lanes[kLanes] = {};
    for (int64_t i = 0; i < whole; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += in[i + l];
    float sum = 0.0f;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    for (int64_t i = whole; i < n; ++i) sum += in[i];
    const float mu = sum / static_cast<float>(n);
    for (int l = 0; l < kLanes; ++l) lanes[l] = 0.0f;
    for (int64_t i = 0; i < whole; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += (in[i + l] - mu) * (in[i + l] - mu);
    float sq = 0.0f;
    for (int l = 0; l < kLanes; ++l) sq += lanes[l];
    for (int64_t i = whole; i < n; ++i) sq += (in[i] - mu) * (in[i] - mu);
    const float rs = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
    mean[row] = mu;
    rstd[row] = rs;
    if (w && b) {
      for (int64_t i = 0; i < n; ++i) out[i] = (in[i] - mu) * rs * w[i] + b[i];
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = (in[i] - mu) * rs * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
  }
}

KOLO_VECTOR_CLONES void layerNormBackwardRowsPortable(const float* __restrict grad, const float* __restrict x,
                                              const float* __restrict w, const float* __restrict mean,
                                              const float* __restrict rstd, int64_t rows, int64_t n,
                                              float* __restrict gx, float* __restrict gw, float* __restrict gb) {
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = x + row * n;
    const float* g = grad + row * n;
    const float mu = mean[row], rs = rstd[row];
    if (gw)
      for (int64_t i = 0; i < n; ++i) gw[i] += g[i] * ((in[i] - mu) * rs);
    if (gb)
      for (int64_t i = 0; i < n; ++i) gb[i] += g[i];
    if (!gx) continue;
    // dx = rs * (dy - mean(dy) - xhat * mean(dy * xhat)) with dy = g * w.
    float sumLanes[kLanes] = {}, dotLanes[kLanes] = {};
    for (int64_t i = 0; i < whole; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float dy = g[i + l] * (w ? w[i + l] : 1.0f);
        sumLanes[l] += dy;
        dotLanes[l] += dy * ((in[i + l] - mu) * rs);
      }
    float sumDy = 0.0f, sumDyXhat = 0.0f;
    for (int l = 0; l < kLanes; ++l) {
      sumDy += sumLanes[l];
      sumDyXhat += dotLanes[l];
    }
    for (int64_t i = whole; i < n; ++i) {
      const float dy = g[i] * (w ? w[i] : 1.0f);
      sumDy += dy;
      sumDyXhat += dy * ((in[i] - mu) * rs);
    }
    const float meanDy = sumDy / static_cast<float>(n), meanDyXhat = sumDyXhat / static_cast<float>(n);
    float* dx = gx + row * n;
    for (int64_t i = 0; i < n; ++i) {
      const float dy = g[i] * (w ? w[i] : 1.0f);
      dx[i] = rs * (dy - meanDy - (in[i] - mu) * rs * meanDyXhat);
    }
  }
}

}  // namespace kolo::detail
