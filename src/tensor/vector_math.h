// Internal: branch-free f32 approximations of exp and erf that the compiler vectorises, and
// the attribute that compiles a loop for AVX-512, AVX2 and the baseline (picked at load
// time), for the per-element and per-row kernels of a transformer step (row_kernels.cc).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KOLO_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KOLO_VECTOR_CLONES
#endif

namespace kolo::detail {

/// e^x to about 2 ulp (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n);
/// 0 below -87.3 (-inf included), +inf above 88.3 (where f32 itself overflows at 88.72), NaN
/// stays NaN.
inline float expApprox(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // NaN goes through as 0 (and is put back at the end): converting NaN to an integer is
  // undefined.
  const float clamped = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : (x == x ? x : 0.0f));
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  y = x < -87.3f ? 0.0f : y;
  y = x > 88.3f ? __builtin_inff() : y;
  return x != x ? x : y;
}

/// erf(x) to 5e-7 absolute (Abramowitz and Stegun 7.1.26, 1.5e-7, as PyTorch's vectorised CPU
/// erf, plus f32 rounding): 1 - (a1 t + ... + a5 t^5) e^(-x^2) with t = 1 / (1 + p|x|), odd in x.
/// `expMinusX2` is e^(-x^2), passed in so that a caller that needs it too computes it once.
inline float erfFromExp(float x, float expMinusX2) {
  constexpr float p = 0.3275911f, a1 = 0.254829592f, a2 = -0.284496736f, a3 = 1.421413741f,
                  a4 = -1.453152027f, a5 = 1.061405429f;
  const float ax = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + p * ax);
  const float poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t;
  const float y = 1.0f - poly * expMinusX2;
  return x < 0.0f ? -y : y;
}

/// erf(x) as erfFromExp(x, e^(-x^2)).
inline float erfApprox(float x) { return erfFromExp(x, expApprox(-x * x)); }

}  // namespace kolo::detail
