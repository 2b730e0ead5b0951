// Internal: single-thread f32 GEMM kernels for products with one small dimension (a batch
// of up to a few hundred rows, or a short inner dimension), as a training step has. They
// read both operands where they lie instead of packing the large one, and write C without
// zeroing it first, which is what a BLAS spends most of its extra time on at these shapes.
#pragma once

#include <cblas.h>

#include <cstdint>

namespace kolo::detail {

/// C = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm. Products with many rows (NN, NT)
/// or a long inner dimension (TN) whose other sizes are at least 64 go in blocks the kernels
/// win on. Returns false, touching nothing, when no kernel here suits the call: no AVX-512,
/// more than one OpenBLAS thread, both operands transposed, shapes outside the small range,
/// or KOLO_SMALL_GEMM=0 set.
bool smallGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace kolo::detail
