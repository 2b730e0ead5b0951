// Internal: the per-element functions of a transformer step on 16 floats at once (AVX-512),
// for the row kernels (row_kernels.cc): the exponential (as expApprox), and GELU and its
// derivative from a table of 32 degree-5 polynomials in |x| (gelu_tables.h, made by
// scripts/gelu_tables.py): no exponential and no division, within 3e-7 absolute of the exact
// erf form that PyTorch computes.
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "tensor/gelu_tables.h"

#define KOLO_HAVE_VECTOR_AVX512 1
#define KOLO_VECTOR_AVX512 __attribute__((target("avx512f,fma")))

namespace kolo::detail {

// The zero-masked forms with every lane set stand for the plain ones below: GCC 12 warns of
// the plain forms' undefined pass-through operand.
inline constexpr __mmask16 kAllLanes = 0xFFFF;

/// The sum and the largest of the 16 lanes: halves, quarters, pairs and neighbours folded
/// onto each other, in 512-bit registers throughout.
KOLO_VECTOR_AVX512 inline float sumLanes(__m512 v) {
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAllLanes, v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAllLanes, v, v, 0xB1));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAllLanes, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAllLanes, v, 0xB1));
  return _mm512_cvtss_f32(v);
}

KOLO_VECTOR_AVX512 inline float maxLanes(__m512 v) {
  v = _mm512_maskz_max_ps(kAllLanes, v, _mm512_maskz_shuffle_f32x4(kAllLanes, v, v, 0x4E));
  v = _mm512_maskz_max_ps(kAllLanes, v, _mm512_maskz_shuffle_f32x4(kAllLanes, v, v, 0xB1));
  v = _mm512_maskz_max_ps(kAllLanes, v, _mm512_maskz_permute_ps(kAllLanes, v, 0x4E));
  v = _mm512_maskz_max_ps(kAllLanes, v, _mm512_maskz_permute_ps(kAllLanes, v, 0xB1));
  return _mm512_cvtss_f32(v);
}

/// e^x as expApprox (vector_math.h) computes it, 16 lanes at once, for x up to 88.3 (a
/// softmax's scores less their row's largest): Cephes' degree-6 polynomial in r = x - n ln2,
/// times 2^n; 0 below -87.3 (-inf included), NaN stays NaN. Above 88.3, where expApprox gives
/// +inf, the result is undefined: the causal softmax has no such scores among those it keeps,
/// and the clamp and select for them were a fifth of the operations.
KOLO_VECTOR_AVX512 inline __m512 expVectorUpTo88(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  // max returns its second operand for a NaN: x, which the polynomial carries through.
  const __m512 c = _mm512_maskz_max_ps(kAllLanes, lo, x);
  const __m512 n =
      _mm512_maskz_roundscale_ps(kAllLanes, _mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_maskz_slli_epi32(
      kAllLanes, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(kAllLanes, n), _mm512_set1_epi32(127)),
      23);
  // 0 below -87.3; a NaN is not below it and keeps its product.
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), p, _mm512_castsi512_ps(bits));
}

// E(a) or D(a) (table c) at a = |x| >= 0: interval i = floor(4a), t = 4a - i - 1/2 (both exact
// in f32), Horner in t with the interval's coefficients picked by a permute per power. a is
// clamped to the float below 8 (interval 31, t just below 1/2), where both polynomials round to
// their parts' limits in f32, 1 and 1/2, as the parts do past 8 (every float checked against a
// select of the limit there: the same bits). A NaN passes the clamp (min returns its second
// operand) and comes out NaN.
KOLO_VECTOR_AVX512 inline __m512 geluPart(__m512 a, const float (&c)[kGeluDegree + 1][kGeluIntervals]) {
  const __m512 s = _mm512_mul_ps(_mm512_maskz_min_ps(kAllLanes, _mm512_set1_ps(0x1.fffffep2f), a),
                                 _mm512_set1_ps(kGeluIntervalsPerUnit));
  const __m512i i = _mm512_maskz_cvttps_epi32(kAllLanes, s);
  const __m512 whole =
      _mm512_maskz_roundscale_ps(kAllLanes, s, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 t = _mm512_sub_ps(_mm512_sub_ps(s, whole), _mm512_set1_ps(0.5f));
  __m512 p = _mm512_permutex2var_ps(_mm512_load_ps(c[kGeluDegree]), i,
                                    _mm512_load_ps(c[kGeluDegree] + 16));
  for (int k = kGeluDegree - 1; k >= 0; --k)
    p = _mm512_fmadd_ps(p, t,
                        _mm512_permutex2var_ps(_mm512_load_ps(c[k]), i, _mm512_load_ps(c[k] + 16)));
  return p;
}

/// gelu(x) = x Phi(x) = (x + |x| erf(|x| / sqrt 2)) / 2. NaN stays NaN; -inf gives NaN, as
/// the erf form does.
KOLO_VECTOR_AVX512 inline __m512 geluVector(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  return _mm512_mul_ps(_mm512_set1_ps(0.5f),
                       _mm512_fmadd_ps(a, geluPart(a, kGeluErfPart), x));
}

/// gelu'(x) = Phi(x) + x phi(x) = 1/2 + sign(x) D(|x|). NaN stays NaN.
KOLO_VECTOR_AVX512 inline __m512 geluDerivativeVector(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 d = _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(geluPart(a, kGeluDerivativePart)), sign));
  return _mm512_add_ps(_mm512_set1_ps(0.5f), d);
}

}  // namespace kolo::detail

#endif
