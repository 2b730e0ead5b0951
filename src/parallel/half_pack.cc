// fp16 packing (half_pack.h): with F16C, 8 at a time, where the CPU has it (the scalar
// conversion's branches would cost more than the 16-bit wire saves); floatToHalf otherwise.
#include "parallel/half_pack.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kolo/dtype.h"

namespace kolo::parallel::detail {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void floatsToHalfF16c(const float* in, uint16_t* out, size_t n,
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

__attribute__((target("avx2,f16c"))) void halvesToFloatF16c(const uint16_t* in, float* out, size_t n,
                                                            float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), s));
  }
  for (; i < n; ++i) out[i] = halfToFloat(in[i]) * scale;
}

// F16C is read from CPUID leaf 1 (ECX bit 29) rather than __builtin_cpu_supports, whose
// "f16c" only newer clang knows.
bool haveF16c() {
  static const bool have = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return have;
}
#endif

}  // namespace

void floatsToHalf(const float* in, uint16_t* out, size_t n, float scale) {
#if defined(__x86_64__)
  if (haveF16c()) return floatsToHalfF16c(in, out, n, scale);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = floatToHalf(in[i] * scale);
}

void halvesToFloat(const uint16_t* in, float* out, size_t n, float scale) {
#if defined(__x86_64__)
  if (haveF16c()) return halvesToFloatF16c(in, out, n, scale);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = halfToFloat(in[i]) * scale;
}

}  // namespace kolo::parallel::detail
