// KOLO_ROW_LOOPS: the attribute of the convolution's and pooling's short row loops.
#pragma once

// GCC turns short copy and fill loops into memcpy/memset calls; for the 8..24-element rows
// of small images the call costs more than the copy, so the row loops below opt out, and
// get an AVX2 clone (picked at load time) on x86-64, whose baseline build has SSE only.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KOLO_ROW_LOOPS \
  __attribute__((optimize("no-tree-loop-distribute-patterns"), target_clones("avx2", "default")))
#elif defined(__GNUC__) && !defined(__clang__)
#define KOLO_ROW_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define KOLO_ROW_LOOPS
#endif
