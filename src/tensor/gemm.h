// Internal: the typed CBLAS GEMM wrapper (row-major) shared by the matmul and convolution
// kernels of the tensor layer, so both call one place for f32/f64; f32 products with a
// small dimension go to the kernels of small_gemm.h, and under MatmulPrecision::BF16 (this
// thread's setting) every f32 product to bf16_gemm.h.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <type_traits>

#include "kolo/precision.h"
#include "tensor/bf16_gemm.h"
#include "tensor/small_gemm.h"

namespace kolo::detail {

/// C = alpha op(A) op(B) + beta C, row-major, for T = float or double.
template <class T>
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (matmulPrecision() == MatmulPrecision::BF16) {
      gemmBf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    if (smallGemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace kolo::detail
