// A 16 x 16 square is 16 row loads, four rounds of in-register shuffles (pairs of elements,
// then quads within 128-bit lanes, then lanes across the vector twice) and 16 row stores;
// the edges that do not fill a square go element by element.
#include "tensor/transpose.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KOLO_HAVE_TRANSPOSE_AVX512 1
// GCC 12 reads the self-initialisation inside _mm512_undefined_ps() (the shuffles' unused
// merge source) as an uninitialised value when they are inlined at -O1, as in the sanitizer
// build; no value of it reaches a result.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kolo::detail {

namespace {

void transposeScalar(int64_t r0, int64_t r1, int64_t c0, int64_t c1, const float* from, int64_t ld,
                     float* to, int64_t ldTo) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) to[c * ldTo + r] = from[r * ld + c];
}

#ifdef KOLO_HAVE_TRANSPOSE_AVX512
// GCC 12 takes the deliberately undefined source vector inside its shuffle intrinsics
// (_mm512_undefined_ps) for a use of an uninitialised value once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
// The 16 x 16 square at from (row stride ld) into to (row stride ldTo), transposed.
__attribute__((target("avx512f"))) inline void square16(const float* from, int64_t ld, float* to,
                                                        int64_t ldTo) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(from + i * ld);
  // Per 128-bit lane: rows 2i and 2i + 1 interleaved (a0 b0 a1 b1, a2 b2 a3 b3).
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // Per 128-bit lane: one column of four consecutive rows (a0 b0 c0 d0, ...).
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  // Then the 128-bit lanes: of rows 0-7 and of rows 8-15, then of both halves.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(to + i * ldTo, r[i]);
}

__attribute__((target("avx512f"))) void transposeAvx512(int64_t rows, int64_t cols,
                                                        const float* from, int64_t ld, float* to,
                                                        int64_t ldTo) {
  const int64_t wholeRows = rows / 16 * 16, wholeCols = cols / 16 * 16;
  for (int64_t r = 0; r < wholeRows; r += 16)
    for (int64_t c = 0; c < wholeCols; c += 16)
      square16(from + r * ld + c, ld, to + c * ldTo + r, ldTo);
  transposeScalar(0, wholeRows, wholeCols, cols, from, ld, to, ldTo);
  transposeScalar(wholeRows, rows, 0, cols, from, ld, to, ldTo);
}

#pragma GCC diagnostic pop

bool haveAvx512() {
  static const bool on = __builtin_cpu_supports("avx512f");
  return on;
}
#endif

}  // namespace

void transposeF32(int64_t rows, int64_t cols, const float* from, int64_t ld, float* to,
                  int64_t ldTo) {
#ifdef KOLO_HAVE_TRANSPOSE_AVX512
  if (haveAvx512()) {
    transposeAvx512(rows, cols, from, ld, to, ldTo);
    return;
  }
#endif
  transposeScalar(0, rows, 0, cols, from, ld, to, ldTo);
}

}  // namespace kolo::detail
