// Internal: GELU and its derivative on 16 floats at once (AVX-512) from a table of 32
// degree-5 polynomials in |x| (gelu_tables.h, made by scripts/gelu_tables.py): no exponential
// and no division, within 3e-7 absolute of the exact erf form that PyTorch computes. Used by
// the row kernels and by the GEMM tiles that store a linear layer's GELU (small_gemm.cc).
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

#include "tensor/gelu_tables.h"

#define KOLO_HAVE_GELU_AVX512 1
#define KOLO_GELU_AVX512 __attribute__((target("avx512f,fma")))

namespace kolo::detail {

// E(a) or D(a) (table c) at a = |x| >= 0: interval i = floor(4a), t = 4a - i - 1/2 (both exact
// in f32), Horner in t with the interval's coefficients picked by a permute per power. a is
// clamped to 8 (interval 31 at t = 1/2), past which `limit` (the part's constant) is returned;
// a NaN becomes 8 (min returns its second operand), so the caller keeps its own NaN.
KOLO_GELU_AVX512 inline __m512 geluPart(__m512 a, const float (&c)[kGeluDegree + 1][kGeluIntervals], float limit) {
  // The zero-masked forms with every lane set: GCC 12 warns of the plain forms' undefined
  // pass-through operand.
  constexpr __mmask16 all = 0xFFFF;
  const __m512 s =
      _mm512_mul_ps(_mm512_maskz_min_ps(all, a, _mm512_set1_ps(8.0f)), _mm512_set1_ps(kGeluIntervalsPerUnit));
  const __m512i i = _mm512_maskz_min_epi32(all, _mm512_maskz_cvttps_epi32(all, s), _mm512_set1_epi32(kGeluIntervals - 1));
  const __m512 t = _mm512_sub_ps(_mm512_sub_ps(s, _mm512_maskz_cvtepi32_ps(all, i)), _mm512_set1_ps(0.5f));
  __m512 p = _mm512_permutex2var_ps(_mm512_load_ps(c[kGeluDegree]), i, _mm512_load_ps(c[kGeluDegree] + 16));
  for (int k = kGeluDegree - 1; k >= 0; --k)
    p = _mm512_fmadd_ps(p, t, _mm512_permutex2var_ps(_mm512_load_ps(c[k]), i, _mm512_load_ps(c[k] + 16)));
  return _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(a, _mm512_set1_ps(8.0f), _CMP_GE_OQ), _mm512_set1_ps(limit));
}

/// gelu(x) = x Phi(x) = (x + |x| erf(|x| / sqrt 2)) / 2. NaN stays NaN; -inf gives NaN, as
/// the erf form does.
KOLO_GELU_AVX512 inline __m512 geluVector(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  return _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_fmadd_ps(a, geluPart(a, kGeluErfPart, 1.0f), x));
}

/// gelu'(x) = Phi(x) + x phi(x) = 1/2 + sign(x) D(|x|). NaN stays NaN.
KOLO_GELU_AVX512 inline __m512 geluDerivativeVector(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 d = _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(geluPart(a, kGeluDerivativePart, 0.5f)), sign));
  const __m512 y = _mm512_add_ps(_mm512_set1_ps(0.5f), d);
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

}  // namespace kolo::detail

#endif
