// Register-tiled AVX-512 GEMM without packing. Every kernel computes a tile of up to 6 rows
// by 64 columns (24 accumulators): per step of the inner dimension it loads 4 vectors of a
// row of B and broadcasts 6 elements of A. A row's result never depends on the other rows
// of the call, and each element is one FMA chain in inner-dimension order.
//   NN  C = A B        tiles of C straight from A's rows and B's rows.
//   TN  C = A^T B      the same with A read down its columns (the weight gradient, whose
//                      inner dimension is the batch).
//   NT  C = A B^T      A (the small batch) is packed transposed, then C^T is computed as
//                      B's rows times A^T and written back transposed; with many rows of A,
//                      B is copied transposed instead and the product goes as NN.
// A linear layer's forward (smallLinear) goes as that last NT, with its bias added in the
// tiles' store and its GELU taken over each block of rows once its products are done.
// Shifted rows (gemmShiftedB, gemmShiftedA): the same tiles with the rows of one operand at
// given offsets, a stride-1 convolution's products straight from its padded image.
#include "tensor/small_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "kolo/settings.h"
#include "tensor/row_kernels.h"
#include "tensor/transpose.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KOLO_HAVE_SMALL_GEMM 1
#define KOLO_AVX512 __attribute__((target("avx512f,fma,prfchw")))
#define KOLO_UNROLL _Pragma("GCC unroll 8")
#endif

namespace kolo::detail {

#ifdef KOLO_HAVE_SMALL_GEMM
namespace {

constexpr int kTileRows = 6;
constexpr int kTileCols = 64;
constexpr int kLanes = 16;

// Shapes the kernels win on (measured against OpenBLAS 0.3.21 on one thread): up to this
// many rows of a batch, and an inner dimension whose 64-column panel of B stays in L2.
constexpr int64_t kMaxBatchRows = 256;
constexpr int64_t kMaxDepth = 4096;
constexpr int64_t kMaxTransposedDepth = 512;
constexpr int64_t kMinTransposedCols = 32;
constexpr int64_t kMinChunkedWidth = 64;
// The largest B (n k elements, 1 MiB: the size of L2) that an NT product over many rows
// copies transposed; past it the copy costs more than the kernels win (n 1152-1536, k 384).
constexpr int64_t kMaxTransposedElements = int64_t{1} << 18;
// The largest B (k n elements, 512 KiB: half of L2) that a TN product reads once per row tile.
constexpr int64_t kMaxRowTilesOutsideElements = int64_t{1} << 17;

// C[r, 0..16 NV) = alpha * sum_k a(r, k) B[k, 0..16 NV) + beta C, plus bias[0..16 NV) when
// bias is given, for r < MR, the last vector masked by `last`. a(r, k) is A[r * lda + k], or
// A[k * lda + r] when kDown.
template <int MR, int NV, bool kDown>
KOLO_AVX512 inline void tile(int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb,
                             float alpha, float beta, float* c, int64_t ldc, __mmask16 last, const float* bias) {
  // The tile's output lines, fetched for writing while the products run: inside a training
  // step the outputs are memory that no cache holds, and the stores waited for it (a linear
  // layer's forward in an lm step ran at 93 GFLOP/s against 100 with this, 110 in cache).
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) {
    __builtin_prefetch(c + r * ldc + kLanes * v, 1, 3);
  }
  __m512 acc[MR][NV];
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < depth; ++k) {
    const float* row = b + k * ldb;
    KOLO_UNROLL for (int v = 0; v < NV; ++v) __builtin_prefetch(row + 8 * ldb + kLanes * v, 0, 3);
    __m512 bv[NV];
    KOLO_UNROLL for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, row + kLanes * v) : _mm512_loadu_ps(row + kLanes * v);
    }
    KOLO_UNROLL for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(kDown ? a[k * lda + r] : a[r * lda + k]);
      KOLO_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 alphaV = _mm512_set1_ps(alpha);
  const __m512 betaV = _mm512_set1_ps(beta);
  __m512 biasV[NV];
  KOLO_UNROLL for (int v = 0; v < NV; ++v) {
    biasV[v] = bias ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF), bias + kLanes * v)
                    : _mm512_setzero_ps();
  }
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) {
    const __mmask16 mask = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
    float* out = c + r * ldc + kLanes * v;
    __m512 x = _mm512_mul_ps(alphaV, acc[r][v]);
    // beta == 0 leaves C unread, as BLAS does: a NaN there is overwritten, not propagated.
    if (beta != 0.0f) x = _mm512_fmadd_ps(betaV, _mm512_maskz_loadu_ps(mask, out), x);
    if (bias) x = _mm512_add_ps(x, biasV[v]);
    _mm512_mask_storeu_ps(out, mask, x);
  }
}

template <int MR, bool kDown>
KOLO_AVX512 void tileOfWidth(int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb, float alpha,
                             float beta, float* c, int64_t ldc, int64_t cols, const float* bias) {
  const int tail = static_cast<int>(cols % kLanes);
  const __mmask16 last = tail ? static_cast<__mmask16>((1u << tail) - 1) : static_cast<__mmask16>(0xFFFF);
  switch ((cols + kLanes - 1) / kLanes) {
    case 4: tile<MR, 4, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, last, bias); break;
    case 3: tile<MR, 3, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, last, bias); break;
    case 2: tile<MR, 2, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, last, bias); break;
    default: tile<MR, 1, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, last, bias); break;
  }
}

// A tile of `rows` <= 6 rows and `cols` <= 64 columns, with the bias of its columns.
template <bool kDown>
KOLO_AVX512 void anyTile(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda, const float* b,
                         int64_t ldb, float alpha, float beta, float* c, int64_t ldc, const float* bias = nullptr) {
  switch (rows) {
    case 6: tileOfWidth<6, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, cols, bias); break;
    case 5: tileOfWidth<5, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, cols, bias); break;
    case 4: tileOfWidth<4, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, cols, bias); break;
    case 3: tileOfWidth<3, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, cols, bias); break;
    case 2: tileOfWidth<2, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, cols, bias); break;
    default: tileOfWidth<1, kDown>(depth, a, lda, b, ldb, alpha, beta, c, ldc, cols, bias); break;
  }
}

// C[m x n] = alpha A[m x k] B[k x n] + beta C, plus bias [n] on every row when given.
// Column panels outside, so the k x 64 panel of B stays in cache while the row tiles of A
// pass over it.
KOLO_AVX512 void gemmNN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                        int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr) {
  for (int64_t j = 0; j < n; j += kTileCols)
    for (int64_t i = 0; i < m; i += kTileRows)
      anyTile<false>(std::min<int64_t>(kTileRows, m - i), std::min<int64_t>(kTileCols, n - j), k, a + i * lda, lda,
                     b + j, ldb, alpha, beta, c + i * ldc + j, ldc, bias ? bias + j : nullptr);
}

// C[m x n] = alpha A^T B + beta C with A [k x m], B [k x n] and k small. Row tiles outside,
// so C is written row after row, while B fits in half of L2; past that B would come from L3
// once per row tile, and its 64-column panels go outside instead, each kept in L2 while the
// row tiles pass over it (the weight gradient through the lm's mlp.2, B 512 x 512: 92-96 ->
// 99-100 GFLOP/s in a step).
KOLO_AVX512 void gemmTN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                        int64_t ldb, float beta, float* c, int64_t ldc) {
  const auto at = [&](int64_t i, int64_t j) {
    anyTile<true>(std::min<int64_t>(kTileRows, m - i), std::min<int64_t>(kTileCols, n - j), k, a + i, lda, b + j, ldb,
                  alpha, beta, c + i * ldc + j, ldc);
  };
  if (n * k <= kMaxRowTilesOutsideElements) {
    for (int64_t i = 0; i < m; i += kTileRows)
      for (int64_t j = 0; j < n; j += kTileCols) at(i, j);
  } else {
    for (int64_t j = 0; j < n; j += kTileCols)
      for (int64_t i = 0; i < m; i += kTileRows) at(i, j);
  }
}

// C[m x n] = alpha A[m x k] B[n x k]^T + beta C with m small: A is packed as blocks of
// [k x 64] (A^T), and each 6-row panel of B (in L1) meets every block.
KOLO_AVX512 void gemmNT(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                        int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> packed;
  const int64_t blocks = (m + kTileCols - 1) / kTileCols;
  // Lanes past m in the last block are never loaded (the tile masks them), so no zeroing.
  packed.resize(static_cast<size_t>(blocks * k * kTileCols));
  for (int64_t i = 0; i < m; ++i) {
    float* to = packed.data() + (i / kTileCols) * k * kTileCols + i % kTileCols;
    const float* from = a + i * lda;
    for (int64_t p = 0; p < k; ++p) to[p * kTileCols] = from[p];
  }
  alignas(64) float transposed[kTileRows * kTileCols];
  for (int64_t j = 0; j < n; j += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, n - j);
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t i0 = block * kTileCols;
      const int64_t cols = std::min<int64_t>(kTileCols, m - i0);
      anyTile<false>(rows, cols, k, b + j * ldb, ldb, packed.data() + block * k * kTileCols, kTileCols, alpha, 0.0f,
                     transposed, kTileCols);
      for (int64_t i = 0; i < cols; ++i) {
        float* out = c + (i0 + i) * ldc + j;
        for (int64_t r = 0; r < rows; ++r) {
          const float x = transposed[r * kTileCols + i];
          out[r] = beta != 0.0f ? beta * out[r] + x : x;
        }
      }
    }
  }
}

// C[m x n] = alpha A[m x k] B[n x k]^T + beta C with m large (a linear layer's forward over
// many tokens): B, the weight, is transposed once into [k x n] (a copy of n k elements, next
// to the m n k of the product), and the product goes as NN in blocks of kMaxBatchRows rows,
// plus bias [n] when given. With G, each block's rows then get G = gelu(C) (row stride ldg)
// while they are in L2. In the tiles' store, the GELU's polynomial and second output cost more
// than this pass (m 1024, n 512, k 128 alone: 1,256 us without GELU, 1,500 with it in the
// store, 1,423 with the pass; in an lm step 76 -> 85-89 GFLOP/s).
KOLO_AVX512 void gemmNTManyRows(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                                const float* bias = nullptr, float* g = nullptr, int64_t ldg = 0) {
  thread_local std::vector<float> transposed;
  transposed.resize(static_cast<size_t>(k * n));
  transposeF32(n, k, b, ldb, transposed.data(), n);
  for (int64_t r = 0; r < m; r += kMaxBatchRows) {
    const int64_t rows = std::min(kMaxBatchRows, m - r);
    gemmNN(rows, n, k, alpha, a + r * lda, lda, transposed.data(), n, beta, c + r * ldc, ldc, bias);
    if (g)
      for (int64_t i = r; i < r + rows; ++i) geluRows(c + i * ldc, g + i * ldg, n);
  }
}

// The products that gemmNTManyRows wins on (see smallGemm).
bool manyRowsNT(int64_t m, int64_t n, int64_t k) {
  return m > kMaxBatchRows && k <= kMaxDepth && n >= kMinChunkedWidth && k >= kMinChunkedWidth &&
         n * k <= kMaxTransposedElements;
}

// AVX-512 present and not switched off with KOLO_SMALL_GEMM=0 (to compare with OpenBLAS).
bool enabled() {
  static const bool on = [] {
    if (!settings::smallGemm()) return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  }();
  return on;
}

// Shifted rows: the products of a stride-1 convolution without im2col. Row r of the A tile
// is aRows[r] (a(r, k) = aRows[r][k]); row k of B is b + bOffsets[k] when bOffsets is given
// (a window of the padded image, shifted by the kernel position of k), else b + k ldb. C is
// written (beta 0) or added to (beta 1).
template <int MR, int NV>
KOLO_AVX512 inline void shiftedTile(int64_t depth, const float* const* aRows, const float* b, int64_t ldb,
                                    const int64_t* bOffsets, float beta, float* c, int64_t ldc, __mmask16 last) {
  __m512 acc[MR][NV];
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < depth; ++k) {
    const float* row = bOffsets ? b + bOffsets[k] : b + k * ldb;
    __m512 bv[NV];
    KOLO_UNROLL for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, row + kLanes * v) : _mm512_loadu_ps(row + kLanes * v);
    }
    KOLO_UNROLL for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(aRows[r][k]);
      KOLO_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) {
    const __mmask16 mask = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
    float* out = c + r * ldc + kLanes * v;
    __m512 x = acc[r][v];
    if (beta != 0.0f) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, out));
    _mm512_mask_storeu_ps(out, mask, x);
  }
}

template <int MR>
KOLO_AVX512 void shiftedTileOfWidth(int64_t depth, const float* const* aRows, const float* b, int64_t ldb,
                                    const int64_t* bOffsets, float beta, float* c, int64_t ldc, int64_t cols) {
  const int tail = static_cast<int>(cols % kLanes);
  const __mmask16 last = tail ? static_cast<__mmask16>((1u << tail) - 1) : static_cast<__mmask16>(0xFFFF);
  switch ((cols + kLanes - 1) / kLanes) {
    case 4: shiftedTile<MR, 4>(depth, aRows, b, ldb, bOffsets, beta, c, ldc, last); break;
    case 3: shiftedTile<MR, 3>(depth, aRows, b, ldb, bOffsets, beta, c, ldc, last); break;
    case 2: shiftedTile<MR, 2>(depth, aRows, b, ldb, bOffsets, beta, c, ldc, last); break;
    default: shiftedTile<MR, 1>(depth, aRows, b, ldb, bOffsets, beta, c, ldc, last); break;
  }
}

// C[m x n] (+)= A B over tiles of 6 x 64, A's row i at aRows[i], B's rows as shiftedTile's.
KOLO_AVX512 void shiftedGemm(int64_t m, int64_t n, int64_t k, const float* const* aRows, const float* b,
                             int64_t ldb, const int64_t* bOffsets, float beta, float* c, int64_t ldc) {
  for (int64_t j = 0; j < n; j += kTileCols) {
    const int64_t cols = std::min<int64_t>(kTileCols, n - j);
    for (int64_t i = 0; i < m; i += kTileRows) {
      const float* const* rows = aRows + i;
      float* out = c + i * ldc + j;
      switch (std::min<int64_t>(kTileRows, m - i)) {
        case 6: shiftedTileOfWidth<6>(k, rows, b + j, ldb, bOffsets, beta, out, ldc, cols); break;
        case 5: shiftedTileOfWidth<5>(k, rows, b + j, ldb, bOffsets, beta, out, ldc, cols); break;
        case 4: shiftedTileOfWidth<4>(k, rows, b + j, ldb, bOffsets, beta, out, ldc, cols); break;
        case 3: shiftedTileOfWidth<3>(k, rows, b + j, ldb, bOffsets, beta, out, ldc, cols); break;
        case 2: shiftedTileOfWidth<2>(k, rows, b + j, ldb, bOffsets, beta, out, ldc, cols); break;
        default: shiftedTileOfWidth<1>(k, rows, b + j, ldb, bOffsets, beta, out, ldc, cols); break;
      }
    }
  }
}

}  // namespace

bool smallGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // alpha == 0 must not read A and B (a NaN there stays out of C): BLAS does that.
  if (m <= 0 || n <= 0 || k <= 0 || alpha == 0.0f || !enabled() || openblas_get_num_threads() != 1)
    return false;
  const bool transA = ta != CblasNoTrans, transB = tb != CblasNoTrans;
  if (!transA && !transB && m <= kMaxBatchRows && k <= kMaxDepth) {
    gemmNN(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return true;
  }
  if (transA && !transB && k <= kMaxTransposedDepth) {
    gemmTN(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return true;
  }
  // A transformer's linears over many tokens: M = B*T rows in blocks of kMaxBatchRows, and
  // the weight gradient's inner dimension B*T in chunks added into C, each block a product
  // the kernels win on (8-11% over OpenBLAS, which spends that on packing, at M 1024 with
  // K, N of 128-512). Narrow products (a convolution's few channels) stay with OpenBLAS.
  if (!transA && !transB && k <= kMaxDepth && n >= kMinChunkedWidth && k >= kMinChunkedWidth) {
    for (int64_t r = 0; r < m; r += kMaxBatchRows)
      gemmNN(std::min(kMaxBatchRows, m - r), n, k, alpha, a + r * lda, lda, b, ldb, beta, c + r * ldc, ldc);
    return true;
  }
  if (transA && !transB && m >= kMinChunkedWidth && n >= kMinChunkedWidth) {
    for (int64_t d = 0; d < k; d += kMaxTransposedDepth)
      gemmTN(m, n, std::min(kMaxTransposedDepth, k - d), alpha, a + d * lda, lda, b + d * ldb, ldb,
             d == 0 ? beta : 1.0f, c, ldc);
    return true;
  }
  if (!transA && transB && m <= kMaxBatchRows && n >= kMinTransposedCols && k <= kMaxDepth) {
    gemmNT(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return true;
  }
  // The forward of those linears: 4-9% over OpenBLAS at the same shapes (M 1024, K and N of
  // 128-512), whose packing of both operands the one transposed copy of B replaces.
  if (!transA && transB && manyRowsNT(m, n, k)) {
    gemmNTManyRows(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return true;
  }
  return false;
}

bool smallLinear(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w, int64_t ldw,
                 const float* bias, float* c, int64_t ldc, float* g, int64_t ldg) {
  if (m <= 0 || n <= 0 || k <= 0 || !enabled() || openblas_get_num_threads() != 1 || !manyRowsNT(m, n, k))
    return false;
  gemmNTManyRows(m, n, k, 1.0f, x, ldx, w, ldw, 0.0f, c, ldc, bias, g, ldg);
  return true;
}

bool shiftedRowsAvailable() { return enabled() && openblas_get_num_threads() == 1; }

void gemmShiftedB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  const int64_t* bOffsets, float* c, int64_t ldc) {
  thread_local std::vector<const float*> rows;
  rows.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) rows[static_cast<size_t>(i)] = a + i * lda;
  shiftedGemm(m, n, k, rows.data(), b, 0, bOffsets, 0.0f, c, ldc);
}

void gemmShiftedA(int64_t m, int64_t n, int64_t k, const float* a, const int64_t* aOffsets, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  thread_local std::vector<const float*> rows;
  rows.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) rows[static_cast<size_t>(i)] = a + aOffsets[i];
  shiftedGemm(m, n, k, rows.data(), b, ldb, nullptr, 1.0f, c, ldc);
}

#else

bool shiftedRowsAvailable() { return false; }

void gemmShiftedB(int64_t, int64_t, int64_t, const float*, int64_t, const float*, const int64_t*, float*,
                  int64_t) {}

void gemmShiftedA(int64_t, int64_t, int64_t, const float*, const int64_t*, const float*, int64_t, float*,
                  int64_t) {}

bool smallGemm(CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int64_t, int64_t, int64_t, float, const float*, int64_t,
               const float*, int64_t, float, float*, int64_t) {
  return false;
}

bool smallLinear(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, const float*, float*,
                 int64_t, float*, int64_t) {
  return false;
}

#endif

}  // namespace kolo::detail
