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

/// A linear layer's forward over many rows in one pass: C = X W^T (+ bias on every row when
/// `bias` is not null) with X (m x k), W (n x k), C (m x n), and G = gelu(C) (m x n) as well
/// when `g` is not null: the bias in each tile's store, the GELU over each block of rows while
/// it is in cache. Returns false, touching nothing, where smallGemm would not run this NT
/// product over many rows (no AVX-512, more than one OpenBLAS thread, m <= 256, W larger than
/// 256 K elements, ...).
bool smallLinear(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w, int64_t ldw,
                 const float* bias, float* c, int64_t ldc, float* g, int64_t ldg);

}  // namespace kolo::detail
