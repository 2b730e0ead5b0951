// Closed-form collective inputs and results (see values.h).
#include "comm_algorithms/values.h"

#include <cstdint>
#include <cstring>
#include <sstream>

namespace kolo::comm::testing {

double contribution(int rank, size_t index, ReduceOp op) {
  if (op == ReduceOp::Prod) return ((static_cast<size_t>(rank) + index) % 2 == 1) ? 2.0 : 1.0;
  return static_cast<double>(rank + 1) + static_cast<double>(index % 7);
}

void storeValue(DType dtype, void* buf, size_t i, double v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case DType::F64: static_cast<double*>(buf)[i] = v; return;
    case DType::F16: static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(v)); return;
    case DType::BF16: static_cast<uint16_t*>(buf)[i] = floatToBFloat16(static_cast<float>(v)); return;
    case DType::I32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); return;
    case DType::I64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); return;
    case DType::U8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff); return;
  }
}

double loadValue(DType dtype, const void* buf, size_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(buf)[i];
    case DType::F64: return static_cast<const double*>(buf)[i];
    case DType::F16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::BF16: return bfloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::I32: return static_cast<const int32_t*>(buf)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::U8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

std::vector<char> makeInput(DType dtype, size_t count, int rank, ReduceOp op) {
  std::vector<char> out(count * dtypeSize(dtype) + 1);  // +1: never a null data() for count 0
  for (size_t i = 0; i < count; ++i) storeValue(dtype, out.data(), i, contribution(rank, i, op));
  return out;
}

std::vector<char> expectedResult(DType dtype, size_t count, int n, ReduceOp op) {
  std::vector<char> out(count * dtypeSize(dtype) + 1);
  for (size_t i = 0; i < count; ++i) {
    const double m = static_cast<double>(i % 7);
    const double sum = n * (n + 1) / 2.0 + n * m;
    double v = 0;
    switch (op) {
      case ReduceOp::Sum: v = sum; break;
      case ReduceOp::Min: v = 1 + m; break;
      case ReduceOp::Max: v = n + m; break;
      case ReduceOp::Prod: {
        int odd = 0;
        for (int r = 0; r < n; ++r) odd += ((static_cast<size_t>(r) + i) % 2 == 1) ? 1 : 0;
        v = static_cast<double>(1 << odd);
        break;
      }
      case ReduceOp::Avg:
        // The sum is exact; the division rounds once in the element type (f32 for halves),
        // integers truncate.
        switch (dtype) {
          case DType::F64: v = sum / n; break;
          case DType::F32:
          case DType::F16:
          case DType::BF16: v = static_cast<float>(sum) / static_cast<float>(n); break;
          default: v = static_cast<double>(static_cast<int64_t>(sum) / n); break;
        }
        break;
    }
    storeValue(dtype, out.data(), i, v);
  }
  return out;
}

std::string firstDifference(DType dtype, const void* got, const void* want, size_t count) {
  const size_t esize = dtypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * esize, static_cast<const char*>(want) + i * esize, esize) != 0) {
      std::ostringstream msg;
      msg << dtypeName(dtype) << " element " << i << " of " << count << ": got " << loadValue(dtype, got, i)
          << ", want " << loadValue(dtype, want, i);
      return msg.str();
    }
  }
  return "";
}

}  // namespace kolo::comm::testing
