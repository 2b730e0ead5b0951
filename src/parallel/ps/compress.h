// 16-bit packing of the values that cross the wire under --ps-compress bf16|fp16: gradients
// on the way to the servers and parameters on the way back take half the bytes. Rounding is
// to nearest even, as kolo's 16-bit tensors round; NaN stays NaN. fp16 has 5 exponent bits
// (largest 65504, smallest subnormal 6e-8), so each message is scaled by a power of two that
// puts its largest magnitude at 2^14: nothing finite overflows, and values down to 2^-38 of
// the largest survive. The exponent travels in the message's header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolo::parallel::ps::detail {

void packBf16(const float* in, uint16_t* out, size_t n);
void unpackBf16(const uint16_t* in, float* out, size_t n);

/// The largest |x| of the finite values among in[0..n) (0 when there are none).
float maxAbs(const float* in, size_t n);
/// The power of two k with which fp16 carries values of largest magnitude `largest`:
/// largest * 2^k lies in [2^13, 2^14) (k = 0 for 0); clamped to [-120, 120].
int halfExponent(float largest);
/// out[i] = fp16(in[i] * 2^k) and back: in[i] * 2^-k.
void packHalf(const float* in, uint16_t* out, size_t n, int k);
void unpackHalf(const uint16_t* in, float* out, size_t n, int k);

}  // namespace kolo::parallel::ps::detail
