// Internal helpers of the tensor layer: dtype dispatch to C++ element types, element
// conversions (including f16/bf16 bit patterns), and a strided N-d loop used by kernels.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kolo/dtype.h"
#include "kolo/error.h"
#include "kolo/tensor.h"

namespace kolo::detail {

/// Storage type for IEEE binary16 elements.
struct Half {
  uint16_t bits;
};
/// Storage type for bfloat16 elements.
struct BFloat16 {
  uint16_t bits;
};

template <class T> struct TypeTag { using type = T; };

/// Calls fn(TypeTag<T>{}) with T the element type of dtype.
template <class Fn>
decltype(auto) dispatchAll(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(TypeTag<float>{});
    case DType::F64: return fn(TypeTag<double>{});
    case DType::F16: return fn(TypeTag<Half>{});
    case DType::BF16: return fn(TypeTag<BFloat16>{});
    case DType::I32: return fn(TypeTag<int32_t>{});
    case DType::I64: return fn(TypeTag<int64_t>{});
    case DType::U8: return fn(TypeTag<uint8_t>{});
  }
  KOLO_THROW(InvalidArgument, "unknown dtype code ", static_cast<int>(dtype));
}

/// Calls fn(TypeTag<T>{}) for f32/f64; throws naming `op` for any other dtype.
template <class Fn>
decltype(auto) dispatchFloat(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(TypeTag<float>{});
    case DType::F64: return fn(TypeTag<double>{});
    default: break;
  }
  KOLO_THROW(InvalidArgument, op, ": dtype ", dtypeName(dtype),
             " is not supported for compute (f32 and f64 are; convert with to())");
}

template <class T> inline double toDouble(T v) { return static_cast<double>(v); }
template <> inline double toDouble<Half>(Half v) { return halfToFloat(v.bits); }
template <> inline double toDouble<BFloat16>(BFloat16 v) { return bfloat16ToFloat(v.bits); }

/// Converts one element between storage types (half types pass through float).
template <class D, class S>
inline D convertElement(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_same_v<D, Half>) {
    return Half{floatToHalf(static_cast<float>(toDouble(v)))};
  } else if constexpr (std::is_same_v<D, BFloat16>) {
    return BFloat16{floatToBFloat16(static_cast<float>(toDouble(v)))};
  } else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return static_cast<D>(toDouble(v));
  } else {
    return static_cast<D>(v);
  }
}

/// Iterates an N-d index space row by row: for each row along the last dimension calls
/// rowFn(offsets, n, innerStrides) where offsets are element offsets of each operand.
/// A scalar shape is one row of one element.
template <size_t K, class RowFn>
void stridedRows(const Shape& shape, const std::array<const int64_t*, K>& strides,
                 std::array<int64_t, K> base, RowFn&& rowFn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  for (int64_t d = 0; d < nd; ++d)
    if (shape[d] == 0) return;
  if (nd == 0) {
    std::array<int64_t, K> inner{};
    rowFn(base, int64_t{1}, inner);
    return;
  }
  std::array<int64_t, K> inner{};
  for (size_t k = 0; k < K; ++k) inner[k] = strides[k][nd - 1];
  const int64_t n = shape[nd - 1];
  std::vector<int64_t> idx(nd > 1 ? nd - 1 : 0, 0);
  std::array<int64_t, K> off = base;
  while (true) {
    rowFn(off, n, inner);
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      ++idx[d];
      for (size_t k = 0; k < K; ++k) off[k] += strides[k][d];
      if (idx[d] < shape[d]) break;
      for (size_t k = 0; k < K; ++k) off[k] -= strides[k][d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace kolo::detail
