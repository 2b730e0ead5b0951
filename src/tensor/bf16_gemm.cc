// bf16 GEMM with f32 accumulation. The native path packs op(A) as bf16 pairs along k (rows of
// pairs, or for a transposed A pairs by row of the stored A^T) and op(B) as rows of pairs
// (B[2p][j], B[2p+1][j]) per column, so that one vdpbf16ps adds two products to 16 columns of
// C at once; conversion by vcvtne(2)ps2bf16; tiles of 6 rows by up to 64 columns, as the f32 kernels
// of small_gemm.cc, with the k x 64 panel of B in cache while the row tiles pass over it.
#include "tensor/bf16_gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KOLO_HAVE_BF16_KERNEL 1
#define KOLO_AVX512_BF16 __attribute__((target("avx512f,avx512bf16")))
#define KOLO_UNROLL _Pragma("GCC unroll 8")
#endif

namespace kolo::detail {

namespace {

// f32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet).
inline uint32_t toBf16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : rounded;
}

inline float roundToBf16(float value) {
  const uint32_t bits = toBf16(value) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline float opAt(const float* x, int64_t ld, bool trans, int64_t row, int64_t col) {
  return trans ? x[col * ld + row] : x[row * ld + col];
}

#ifdef KOLO_HAVE_BF16_KERNEL

constexpr int kLanes = 16;
constexpr int kTileRows = 6;
constexpr int64_t kTileCols = 64;

// C[r, 0..16 NV) = alpha sum_p A2(r, p) . B2[p, 0..16 NV) + beta C for r < MR, where A2 and B2
// hold bf16 pairs; the last vector masked by `last`. A2(r, p) is a2[r * lda2 + p], or
// a2[p * lda2 + r] when kDown.
template <int MR, int NV, bool kDown>
KOLO_AVX512_BF16 inline void tile(int64_t pairs, const uint32_t* a2, int64_t lda2, const uint32_t* b2, int64_t ldb2,
                                  float alpha, float beta, float* c, int64_t ldc, __mmask16 last) {
  __m512 acc[MR][NV];
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const uint32_t* row = b2 + p * ldb2;
    __m512i bv[NV];
    KOLO_UNROLL for (int v = 0; v < NV; ++v) {
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(last, row + kLanes * v) : _mm512_loadu_si512(row + kLanes * v);
    }
    KOLO_UNROLL for (int r = 0; r < MR; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(kDown ? a2[p * lda2 + r] : a2[r * lda2 + p]));
      KOLO_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  const __m512 alphaV = _mm512_set1_ps(alpha);
  const __m512 betaV = _mm512_set1_ps(beta);
  KOLO_UNROLL for (int r = 0; r < MR; ++r) KOLO_UNROLL for (int v = 0; v < NV; ++v) {
    const __mmask16 mask = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
    float* out = c + r * ldc + kLanes * v;
    __m512 x = _mm512_mul_ps(alphaV, acc[r][v]);
    if (beta != 0.0f) x = _mm512_fmadd_ps(betaV, _mm512_maskz_loadu_ps(mask, out), x);
    _mm512_mask_storeu_ps(out, mask, x);
  }
}

template <int MR, bool kDown>
KOLO_AVX512_BF16 void tileOfWidth(int64_t pairs, const uint32_t* a2, int64_t lda2, const uint32_t* b2, int64_t ldb2,
                                  float alpha, float beta, float* c, int64_t ldc, int64_t cols) {
  const int tail = static_cast<int>(cols % kLanes);
  const __mmask16 last = tail ? static_cast<__mmask16>((1u << tail) - 1) : static_cast<__mmask16>(0xFFFF);
  switch ((cols + kLanes - 1) / kLanes) {
    case 4: tile<MR, 4, kDown>(pairs, a2, lda2, b2, ldb2, alpha, beta, c, ldc, last); break;
    case 3: tile<MR, 3, kDown>(pairs, a2, lda2, b2, ldb2, alpha, beta, c, ldc, last); break;
    case 2: tile<MR, 2, kDown>(pairs, a2, lda2, b2, ldb2, alpha, beta, c, ldc, last); break;
    default: tile<MR, 1, kDown>(pairs, a2, lda2, b2, ldb2, alpha, beta, c, ldc, last); break;
  }
}

// C (m x n) from A2 (m x pairs, or pairs x m when kDown) and B2 (pairs x n).
template <bool kDown>
KOLO_AVX512_BF16 void nativeGemm(int64_t m, int64_t n, int64_t pairs, float alpha, const uint32_t* a2,
                                 const uint32_t* b2, float beta, float* c, int64_t ldc) {
  const int64_t lda2 = kDown ? m : pairs;
  for (int64_t j = 0; j < n; j += kTileCols) {
    const int64_t cols = std::min(kTileCols, n - j);
    for (int64_t i = 0; i < m; i += kTileRows) {
      const uint32_t* a = kDown ? a2 + i : a2 + i * pairs;
      const uint32_t* b = b2 + j;
      float* out = c + i * ldc + j;
      switch (std::min<int64_t>(kTileRows, m - i)) {
        case 6: tileOfWidth<6, kDown>(pairs, a, lda2, b, n, alpha, beta, out, ldc, cols); break;
        case 5: tileOfWidth<5, kDown>(pairs, a, lda2, b, n, alpha, beta, out, ldc, cols); break;
        case 4: tileOfWidth<4, kDown>(pairs, a, lda2, b, n, alpha, beta, out, ldc, cols); break;
        case 3: tileOfWidth<3, kDown>(pairs, a, lda2, b, n, alpha, beta, out, ldc, cols); break;
        case 2: tileOfWidth<2, kDown>(pairs, a, lda2, b, n, alpha, beta, out, ldc, cols); break;
        default: tileOfWidth<1, kDown>(pairs, a, lda2, b, n, alpha, beta, out, ldc, cols); break;
      }
    }
  }
}

// dst[j] = (bf16(r0[j]), bf16(r1[j])) as one 32-bit pair, r1 null meaning zeros: two rows of an
// operand stored along k (rows 2p and 2p + 1) become row p of pairs.
KOLO_AVX512_BF16 void interleaveRows(const float* r0, const float* r1, uint32_t* dst, int64_t n) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    // (The maskz forms with every lane set: GCC 12 warns on the plain ones' undefined vector.)
    const __mmask16 all = 0xFFFF;
    const __m512i lo = _mm512_maskz_cvtepu16_epi32(all, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(r0 + j)));
    const __m512i hi = r1 ? _mm512_maskz_cvtepu16_epi32(all, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(r1 + j)))
                          : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + j, _mm512_or_si512(lo, _mm512_maskz_slli_epi32(all, hi, 16)));
  }
  for (; j < n; ++j) dst[j] = toBf16(r0[j]) | ((r1 ? toBf16(r1[j]) : 0u) << 16);
}

// A row stored along k as bf16 in order, which is its row of pairs (an odd k's last pair
// padded with a zero).
KOLO_AVX512_BF16 void convertRow(const float* src, int64_t k, uint32_t* dst) {
  auto* out = reinterpret_cast<uint16_t*>(dst);
  int64_t p = 0;
  for (; p + 2 * kLanes <= k; p += 2 * kLanes) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + p + kLanes), _mm512_loadu_ps(src + p));
    _mm512_storeu_si512(out + p, (__m512i)v);
  }
  for (; p < k; ++p) out[p] = static_cast<uint16_t>(toBf16(src[p]));
  if (k % 2) out[k] = 0;
}

void packAndMultiply(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t pairs = (k + 1) / 2;
  thread_local std::vector<uint32_t> a2, b2, row;
  a2.resize(static_cast<size_t>(m * pairs));
  b2.resize(static_cast<size_t>(pairs * n));
  // op(B) as (pairs, n): from rows 2p, 2p+1 of B, or from B's rows (along k) transposed.
  if (!transB) {
    for (int64_t p = 0; p < pairs; ++p)
      interleaveRows(b + 2 * p * ldb, 2 * p + 1 < k ? b + (2 * p + 1) * ldb : nullptr, b2.data() + p * n, n);
  } else {
    row.resize(static_cast<size_t>(pairs));
    for (int64_t j = 0; j < n; ++j) {
      convertRow(b + j * ldb, k, row.data());
      for (int64_t p = 0; p < pairs; ++p) b2[static_cast<size_t>(p * n + j)] = row[static_cast<size_t>(p)];
    }
  }
  // op(A) as (m, pairs) from A's rows, or as (pairs, m) from rows 2p, 2p+1 of a stored A^T.
  if (!transA) {
    for (int64_t i = 0; i < m; ++i) convertRow(a + i * lda, k, a2.data() + i * pairs);
    nativeGemm<false>(m, n, pairs, alpha, a2.data(), b2.data(), beta, c, ldc);
  } else {
    for (int64_t p = 0; p < pairs; ++p)
      interleaveRows(a + 2 * p * lda, 2 * p + 1 < k ? a + (2 * p + 1) * lda : nullptr, a2.data() + p * m, m);
    nativeGemm<true>(m, n, pairs, alpha, a2.data(), b2.data(), beta, c, ldc);
  }
}

#endif

}  // namespace

bool haveNativeBf16() {
#ifdef KOLO_HAVE_BF16_KERNEL
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return have;
#else
  return false;
#endif
}

void gemmBf16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool native) {
  if (m <= 0 || n <= 0) return;
  const bool transA = ta != CblasNoTrans, transB = tb != CblasNoTrans;
#ifdef KOLO_HAVE_BF16_KERNEL
  if (native && haveNativeBf16() && k > 0 && alpha != 0.0f) {
    packAndMultiply(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#endif
  // The same rounding of the operands, products and sums in f32 by BLAS.
  thread_local std::vector<float> ra, rb;
  ra.resize(static_cast<size_t>(m * k));
  rb.resize(static_cast<size_t>(k * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) ra[static_cast<size_t>(i * k + p)] = roundToBf16(opAt(a, lda, transA, i, p));
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) rb[static_cast<size_t>(p * n + j)] = roundToBf16(opAt(b, ldb, transB, p, j));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, alpha, ra.data(), std::max<int64_t>(k, 1),
              rb.data(), std::max<int64_t>(n, 1), beta, c, ldc);
}

}  // namespace kolo::detail
