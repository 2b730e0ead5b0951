// bf16 packing of the values that cross the wire under --ps-compress bf16: gradients on the
// way to the servers and parameters on the way back take half the bytes. Rounding is to
// nearest even, as kolo's bf16 tensors round; NaN stays NaN.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolo::parallel::ps::detail {

void packBf16(const float* in, uint16_t* out, size_t n);
void unpackBf16(const uint16_t* in, float* out, size_t n);

}  // namespace kolo::parallel::ps::detail
