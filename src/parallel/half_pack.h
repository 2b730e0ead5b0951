// float32 <-> IEEE fp16 over whole buffers, with a scale applied on the way (against overflow
// and underflow of the 16-bit range): used by the Reducer's fp16 hook and the
// parameter-server wire.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolo::parallel::detail {

/// out[i] = fp16(in[i] * scale), rounded to nearest even as floatToHalf.
void floatsToHalf(const float* in, uint16_t* out, size_t n, float scale);
/// out[i] = float(in[i]) * scale.
void halvesToFloat(const uint16_t* in, float* out, size_t n, float scale);

}  // namespace kolo::parallel::detail
