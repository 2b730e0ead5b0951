// bf16 packing (compress.h): branch-free loops that GCC vectorises, built for AVX-512, AVX2
// and the baseline, picked at load time.
#include "parallel/ps/compress.h"

#include <cstring>

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

}  // namespace kolo::parallel::ps::detail
