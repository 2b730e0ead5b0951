// Reduction kernels: one generic loop per (type, op), instantiated twice on x86-64 (the
// baseline ISA and an AVX2+F16C clone picked at run time), so plain loops auto-vectorise
// to the widest registers the CPU has. Half types go through f32 in blocks of kBlock.
#include "comm/algorithms/reduce_kernels.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

#define KOLO_INLINE inline __attribute__((always_inline))

constexpr size_t kBlock = 256;  // f16/bf16 elements converted to f32 at a time

// ---- element operations; integer sum/prod wrap through the unsigned type ----
template <class T>
struct Unsigned {
  using type = T;
};
template <>
struct Unsigned<int32_t> {
  using type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using type = uint64_t;
};

struct SumOp {
  template <class T>
  static KOLO_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = typename Unsigned<T>::type;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <class T>
  static KOLO_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = typename Unsigned<T>::type;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};
struct MinOp {
  template <class T>
  static KOLO_INLINE T apply(T a, T b) {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <class T>
  static KOLO_INLINE T apply(T a, T b) {
    return a < b ? b : a;
  }
};

// ---- half-precision conversions usable inside vectorised loops ----
KOLO_INLINE float bf16ToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

KOLO_INLINE uint16_t floatToBf16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint16_t nan = static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint16_t rounded = static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  return (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

struct Half {};      // tag: f16 storage
struct BFloat {};    // tag: bf16 storage

template <class Tag>
KOLO_INLINE void widen(const uint16_t* in, float* out, size_t n) {
  if constexpr (std::is_same_v<Tag, BFloat>) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = kolo::halfToFloat(in[i]);
  }
}

template <class Tag>
KOLO_INLINE void narrow(const float* in, uint16_t* out, size_t n) {
  if constexpr (std::is_same_v<Tag, BFloat>) {
    for (size_t i = 0; i < n; ++i) out[i] = floatToBf16(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = kolo::floatToHalf(in[i]);
  }
}

#if defined(__x86_64__)
// Fused AVX2 loop for f16/bf16: 8 elements widened, combined and rounded back in
// registers (one pass over memory instead of four).
template <class Tag>
__attribute__((target("avx2,f16c"))) inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (std::is_same_v<Tag, Half>) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Rounds to nearest even; bf16 NaNs stay quiet NaNs (as floatToBf16).
template <class Tag>
__attribute__((target("avx2,f16c"))) inline void store8(uint16_t* p, __m256 v) {
  __m128i packed;
  if constexpr (std::is_same_v<Tag, Half>) {
    packed = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i isNan =
        _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i bits = _mm256_blendv_epi8(rounded, nan, isNan);
    packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// The vector form of Op with the scalar semantics: min_ps(x, y) is x < y ? x : y.
template <class Op>
__attribute__((target("avx2,f16c"))) inline __m256 applyVec(__m256 a, __m256 b);

template <class Tag, class Op>
__attribute__((target("avx2,f16c"), noinline)) void halfBinaryAvx2(uint16_t* out, const uint16_t* a,
                                                                    const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store8<Tag>(out + i, applyVec<Op>(load8<Tag>(a + i), load8<Tag>(b + i)));
  for (; i < n; ++i) {
    float x, y;
    widen<Tag>(a + i, &x, 1);
    widen<Tag>(b + i, &y, 1);
    const float z = Op::template apply<float>(x, y);
    narrow<Tag>(&z, out + i, 1);
  }
}
#endif

#if defined(__x86_64__)
template <>
__attribute__((target("avx2,f16c"))) inline __m256 applyVec<SumOp>(__m256 a, __m256 b) {
  return _mm256_add_ps(a, b);
}
template <>
__attribute__((target("avx2,f16c"))) inline __m256 applyVec<ProdOp>(__m256 a, __m256 b) {
  return _mm256_mul_ps(a, b);
}
template <>
__attribute__((target("avx2,f16c"))) inline __m256 applyVec<MinOp>(__m256 a, __m256 b) {
  return _mm256_min_ps(b, a);  // b < a ? b : a
}
template <>
__attribute__((target("avx2,f16c"))) inline __m256 applyVec<MaxOp>(__m256 a, __m256 b) {
  return _mm256_max_ps(b, a);  // b > a ? b : a, i.e. a < b ? b : a
}
#endif

// ---- generic loops ----
template <class T, class Op>
KOLO_INLINE void binaryLoop(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Op::template apply<T>(a[i], b[i]);
}

template <class Tag, class Op, bool kFast>
KOLO_INLINE void binaryHalfLoop(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n) {
#if defined(__x86_64__)
  if constexpr (kFast) {
    halfBinaryAvx2<Tag, Op>(out, a, b, n);
    return;
  }
#endif
  float fa[kBlock];
  float fb[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = n - start < kBlock ? n - start : kBlock;
    widen<Tag>(a + start, fa, len);
    widen<Tag>(b + start, fb, len);
    for (size_t i = 0; i < len; ++i) fa[i] = Op::template apply<float>(fa[i], fb[i]);
    narrow<Tag>(fa, out + start, len);
  }
}

template <class Op, bool kFast>
KOLO_INLINE void binaryTyped(void* out, const void* a, const void* b, size_t n, DType dtype) {
  switch (dtype) {
    case DType::F32:
      return binaryLoop<float, Op>(static_cast<float*>(out), static_cast<const float*>(a),
                                   static_cast<const float*>(b), n);
    case DType::F64:
      return binaryLoop<double, Op>(static_cast<double*>(out), static_cast<const double*>(a),
                                    static_cast<const double*>(b), n);
    case DType::F16:
      return binaryHalfLoop<Half, Op, kFast>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                                             static_cast<const uint16_t*>(b), n);
    case DType::BF16:
      return binaryHalfLoop<BFloat, Op, kFast>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                                               static_cast<const uint16_t*>(b), n);
    case DType::I32:
      return binaryLoop<int32_t, Op>(static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                                     static_cast<const int32_t*>(b), n);
    case DType::I64:
      return binaryLoop<int64_t, Op>(static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                                     static_cast<const int64_t*>(b), n);
    case DType::U8:
      return binaryLoop<uint8_t, Op>(static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                                     static_cast<const uint8_t*>(b), n);
  }
  KOLO_THROW(InvalidArgument, "reduction: unknown dtype code ", static_cast<int>(dtype));
}

template <bool kFast>
KOLO_INLINE void binaryAny(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return binaryTyped<SumOp, kFast>(out, a, b, n, dtype);
    case ReduceOp::Prod: return binaryTyped<ProdOp, kFast>(out, a, b, n, dtype);
    case ReduceOp::Min: return binaryTyped<MinOp, kFast>(out, a, b, n, dtype);
    case ReduceOp::Max: return binaryTyped<MaxOp, kFast>(out, a, b, n, dtype);
  }
  KOLO_THROW(InvalidArgument, "reduction: unknown op code ", static_cast<int>(op));
}

void binaryBaseline(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  binaryAny<false>(out, a, b, n, dtype, op);
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void binaryAvx2(void* out, const void* a, const void* b, size_t n,
                                                      DType dtype, ReduceOp op) {
  binaryAny<true>(out, a, b, n, dtype, op);
}
#endif

bool cpuHasAvx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

void binary(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
#if defined(__x86_64__)
  if (cpuHasAvx2()) return binaryAvx2(out, a, b, n, dtype, op);
#endif
  binaryBaseline(out, a, b, n, dtype, op);
}

// ---- scaling (average and explicit factors) ----
template <class T, class S>
void divideLoop(T* buf, size_t n, S divisor) {
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] / divisor);
}

template <class T, class S>
void multiplyLoop(T* buf, size_t n, S factor) {
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] * factor);
}

// f16/bf16: widen, apply f (on a float block), narrow.
template <class Tag, class F>
void halfInPlace(uint16_t* buf, size_t n, F f) {
  float tmp[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = n - start < kBlock ? n - start : kBlock;
    widen<Tag>(buf + start, tmp, len);
    f(tmp, len);
    narrow<Tag>(tmp, buf + start, len);
  }
}

}  // namespace

void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  binary(acc, acc, in, count, dtype, op);
}

void reduceTo(void* out, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  binary(out, a, b, count, dtype, op);
}

void finishAvg(void* buf, size_t count, DType dtype, int n) {
  KOLO_CHECK_GE(n, 1, "finishAvg needs a positive rank count");
  if (n == 1 || count == 0) return;
  switch (dtype) {
    case DType::F32: return divideLoop(static_cast<float*>(buf), count, static_cast<float>(n));
    case DType::F64: return divideLoop(static_cast<double*>(buf), count, static_cast<double>(n));
    case DType::F16:
      return halfInPlace<Half>(static_cast<uint16_t*>(buf), count,
                               [n](float* x, size_t len) { divideLoop(x, len, static_cast<float>(n)); });
    case DType::BF16:
      return halfInPlace<BFloat>(static_cast<uint16_t*>(buf), count,
                                 [n](float* x, size_t len) { divideLoop(x, len, static_cast<float>(n)); });
    case DType::I32: return divideLoop(static_cast<int32_t*>(buf), count, static_cast<int32_t>(n));
    case DType::I64: return divideLoop(static_cast<int64_t*>(buf), count, static_cast<int64_t>(n));
    case DType::U8: return divideLoop(static_cast<uint8_t*>(buf), count, static_cast<unsigned>(n));
  }
  KOLO_THROW(InvalidArgument, "finishAvg: unknown dtype code ", static_cast<int>(dtype));
}

void finishReduction(void* buf, size_t count, DType dtype, ReduceOp op, int n) {
  if (op == ReduceOp::Avg) finishAvg(buf, count, dtype, n);
}

void scaleInPlace(void* buf, size_t count, DType dtype, double factor) {
  const float f32 = static_cast<float>(factor);
  switch (dtype) {
    case DType::F32: return multiplyLoop(static_cast<float*>(buf), count, f32);
    case DType::F64: return multiplyLoop(static_cast<double*>(buf), count, factor);
    case DType::F16:
      return halfInPlace<Half>(static_cast<uint16_t*>(buf), count,
                               [f32](float* x, size_t len) { multiplyLoop(x, len, f32); });
    case DType::BF16:
      return halfInPlace<BFloat>(static_cast<uint16_t*>(buf), count,
                                 [f32](float* x, size_t len) { multiplyLoop(x, len, f32); });
    default: break;
  }
  KOLO_THROW(InvalidArgument, "scaleInPlace supports floating dtypes only, not ", dtypeName(dtype));
}

bool reduceKernelsUseAvx2() { return cpuHasAvx2(); }

void reduceToPortable(void* out, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  binaryBaseline(out, a, b, count, dtype, op);
}

}  // namespace kolo::comm::detail

#undef KOLO_INLINE
