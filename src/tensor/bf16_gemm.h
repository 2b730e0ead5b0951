// Internal: f32 GEMM with bf16 products (MatmulPrecision::BF16): the operands rounded to
// bfloat16, products summed in f32 — by AVX-512 BF16 dot products (vdpbf16ps) where the CPU
// has them, otherwise by an f32 GEMM of the rounded operands.
#pragma once

#include <cblas.h>

#include <cstdint>

namespace kolo::detail {

/// C = alpha op(bf16(A)) op(bf16(B)) + beta C, row-major, as cblas_sgemm (C in f32; beta 0
/// leaves C unread). `native` false takes the path without AVX-512 BF16 (for tests).
void gemmBf16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool native = true);

/// Whether the native path is available (AVX-512 F and BF16).
bool haveNativeBf16();

}  // namespace kolo::detail
