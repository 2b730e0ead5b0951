// Internal: an f32 matrix copied transposed, in 16 x 16 squares through AVX-512 registers
// where the CPU has them: the GEMM kernels use it to turn a product with B transposed into
// one along B's rows (a linear layer's weight, an attention head's keys and values).
#pragma once

#include <cstdint>

namespace kolo::detail {

/// to[c * ldTo + r] = from[r * ld + c] for r < rows, c < cols (to and from must not overlap).
/// Exact: only moves elements.
void transposeF32(int64_t rows, int64_t cols, const float* from, int64_t ld, float* to,
                  int64_t ldTo);

}  // namespace kolo::detail
