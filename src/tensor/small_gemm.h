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

/// Whether gemmShiftedB and gemmShiftedA run here: AVX-512 present, one OpenBLAS thread and
/// KOLO_SMALL_GEMM not 0 (they do nothing otherwise: callers take im2col and smallGemm).
bool shiftedRowsAvailable();

/// C[m x n] = A[m x k] B, where row p of B is the n floats from b + bOffsets[p]: a stride-1
/// convolution's output on the padded width (A the weight [O, C kh kw], B's row (c, i, j) the
/// padded image shifted by i rows and j columns). Needs shiftedRowsAvailable().
void gemmShiftedB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  const int64_t* bOffsets, float* c, int64_t ldc);

/// C[m x n] += A B, where row i of A is the k floats from a + aOffsets[i] and B is [k x n]
/// (ldb): a stride-1 convolution's weight gradient transposed (A's rows the shifted padded
/// image, B the output gradient transposed). Needs shiftedRowsAvailable().
void gemmShiftedA(int64_t m, int64_t n, int64_t k, const float* a, const int64_t* aOffsets, const float* b,
                  int64_t ldb, float* c, int64_t ldc);

}  // namespace kolo::detail
