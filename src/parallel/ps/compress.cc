// 16-bit packing (compress.h): bf16 in branch-free loops that GCC vectorises, built for
// AVX-512, AVX2 and the baseline, picked at load time; fp16 with F16C, 8 at a time, where the
// CPU has it (floatToHalf otherwise).
#include "parallel/ps/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kolo/dtype.h"

namespace kolo::parallel::ps::detail {


__attribute__((target_clones("avx512f", "avx2", "default"))) void packBf16(const float* in,
                                                                           uint16_t* out,
                                                                           size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    out[i] = static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void unpackBf16(const uint16_t* in,
                                                                             float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &bits, 4);
  }
}

namespace {

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void packHalfF16c(const float* in, uint16_t* out, size_t n,
                                                       float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(in + i), s),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = floatToHalf(in[i] * scale);
}

__attribute__((target("avx2,f16c"))) void unpackHalfF16c(const uint16_t* in, float* out, size_t n,
                                                         float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), s));
  }
  for (; i < n; ++i) out[i] = halfToFloat(in[i]) * scale;
}

bool haveF16c() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return have;
}
#endif

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) float maxAbs(const float* in,
                                                                          size_t n) {
  float most = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    // NaN compares false and infinity is left out: neither may set the scale.
    most = (a > most && a <= 3.4028235e38f) ? a : most;
  }
  return most;
}

int halfExponent(float largest) {
  if (!(largest > 0.0f) || !std::isfinite(largest)) return 0;
  int e = 0;
  std::frexp(largest, &e);  // largest = m * 2^e, m in [0.5, 1)
  return std::clamp(14 - e, -120, 120);
}

void packHalf(const float* in, uint16_t* out, size_t n, int k) {
  const float scale = std::ldexp(1.0f, k);
#if defined(__x86_64__)
  if (haveF16c()) return packHalfF16c(in, out, n, scale);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = floatToHalf(in[i] * scale);
}

void unpackHalf(const uint16_t* in, float* out, size_t n, int k) {
  const float scale = std::ldexp(1.0f, -k);
#if defined(__x86_64__)
  if (haveF16c()) return unpackHalfF16c(in, out, n, scale);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = halfToFloat(in[i]) * scale;
}

}  // namespace kolo::parallel::ps::detail
