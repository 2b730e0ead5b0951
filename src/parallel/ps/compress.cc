// 16-bit packing (compress.h): bf16 in branch-free loops that GCC vectorises, built for
// AVX-512, AVX2 and the baseline, picked at load time; fp16 through half_pack.h with a
// power-of-two scale.
#include "parallel/ps/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel/half_pack.h"

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
  parallel::detail::floatsToHalf(in, out, n, std::ldexp(1.0f, k));
}

void unpackHalf(const uint16_t* in, float* out, size_t n, int k) {
  parallel::detail::halvesToFloat(in, out, n, std::ldexp(1.0f, -k));
}

}  // namespace kolo::parallel::ps::detail
