// Internal: vectorised f32 loops of a transformer step — GELU and its gradient, softmax rows,
// LayerNorm forward and backward — that the generic kernels of the tensor layer call for
// contiguous f32 data (other dtypes and layouts keep the generic double-precision loops).
#pragma once

#include <cstdint>

namespace kolo::detail {

/// y = x Phi(x) (exact GELU, within 3e-7 absolute of the erf form) over n elements.
void geluRows(const float* x, float* y, int64_t n);
/// out = grad * (Phi(x) + x phi(x)) over n elements.
void geluBackwardRows(const float* grad, const float* x, float* out, int64_t n);
/// rows x n: pre += bias (per column), y = gelu(pre) — a linear layer's bias and GELU in one
/// pass over its GEMM output.
void biasGeluRows(float* pre, const float* bias, float* y, int64_t rows, int64_t n);
/// rows x n: gpre = grad * gelu'(pre), and gbias (n, added to) += its column sums.
void geluBackwardBiasRows(const float* grad, const float* pre, float* gpre, float* gbias, int64_t rows, int64_t n);
/// The four above as a CPU without AVX-512 runs them (erf by Abramowitz and Stegun 7.1.26, to
/// 5e-7 absolute, with a vectorised exponential; AVX2 or baseline clones); the functions above
/// use the table polynomials of vector_avx512.h where the CPU has AVX-512. For tests.
void geluRowsPortable(const float* x, float* y, int64_t n);
void geluBackwardRowsPortable(const float* grad, const float* x, float* out, int64_t n);
void biasGeluRowsPortable(float* pre, const float* bias, float* y, int64_t rows, int64_t n);
void geluBackwardBiasRowsPortable(const float* grad, const float* pre, float* gpre, float* gbias, int64_t rows,
                                  int64_t n);
/// The largest of n >= 1 elements (-inf when all are).
float rowMax(const float* x, int64_t n);
/// p[i] = e^(s[i] - shift) over n elements (p may be s); returns their sum.
float expShiftedSum(const float* s, float* p, int64_t n, float shift);
/// The scores S of a causal attention block -> P in place: `rows` rows of `keys` (row stride
/// ld), row i of query r0 + i sees keys 0..r0 + i. Each row becomes e^(s - lse) over those
/// keys and 0 over the later ones, where lse is its log-sum-exp (written to lse[i], or read
/// from it when fromLse). Vectorised with AVX-512 where the CPU has it.
void causalSoftmaxRows(float* s, int64_t ld, int64_t rows, int64_t keys, int64_t r0, float* lse, bool fromLse);
/// causalSoftmaxRows as a CPU without AVX-512 runs it. For tests.
void causalSoftmaxRowsPortable(float* s, int64_t ld, int64_t rows, int64_t keys, int64_t r0, float* lse,
                               bool fromLse);
/// Softmax's gradient for `rows` rows of n: dp (row stride ldd) holds dL/dP and becomes
/// scale * P (dP - sum(P dP)) with P the rows of p (row stride ldp); the row sum taken over
/// the P in hand, as PyTorch's softmax backward does. Vectorised with AVX-512 where the CPU
/// has it.
void softmaxBackwardRows(const float* p, int64_t ldp, float* dp, int64_t ldd, int64_t rows, int64_t n, float scale);
/// softmaxBackwardRows as a CPU without AVX-512 runs it. For tests.
void softmaxBackwardRowsPortable(const float* p, int64_t ldp, float* dp, int64_t ldd, int64_t rows, int64_t n,
                                 float scale);
/// x[i] = e^x[i] over n elements.
void expInPlace(float* x, int64_t n);
/// Softmax (or log-softmax) of each of `rows` rows of n contiguous elements.
void softmaxRows(const float* x, float* y, int64_t rows, int64_t n, bool log);
/// LayerNorm of rows of n: y = (x - mean) * rstd * w + b (w, b may be null); writes each
/// row's mean and rstd = 1 / sqrt(var + eps) (biased variance).
void layerNormRows(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                   int64_t rows, int64_t n, float eps);
/// Gradients of layerNormRows: gx (may be null) overwritten; gw, gb (may be null) added to.
void layerNormBackwardRows(const float* grad, const float* x, const float* w, const float* mean,
                           const float* rstd, int64_t rows, int64_t n, float* gx, float* gw, float* gb);
/// The two above as a CPU without AVX-512 runs them (AVX2 or baseline clones; the functions
/// above use AVX-512 where the CPU has it). For tests.
void layerNormRowsPortable(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                           int64_t rows, int64_t n, float eps);
void layerNormBackwardRowsPortable(const float* grad, const float* x, const float* w, const float* mean,
                                   const float* rstd, int64_t rows, int64_t n, float* gx, float* gw, float* gb);

}  // namespace kolo::detail
