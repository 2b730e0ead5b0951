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

std::vector<char> makeInput(DType dtype, size_t count, int rank, ReduceOp op) {
  std::vector<char> out(count * dtypeSize(dtype) + 1);  // +1: never a null data() for count 0
  for (size_t i = 0; i < count; ++i) storeElement(dtype, out.data(), i, contribution(rank, i, op));
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
    storeElement(dtype, out.data(), i, v);
  }
  return out;
}

std::string firstDifference(DType dtype, const void* got, const void* want, size_t count) {
  const size_t esize = dtypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * esize, static_cast<const char*>(want) + i * esize, esize) != 0) {
      std::ostringstream msg;
      msg << dtypeName(dtype) << " element " << i << " of " << count << ": got " << loadElement(dtype, got, i)
          << ", want " << loadElement(dtype, want, i);
      return msg.str();
    }
  }
  return "";
}

}  // namespace kolo::comm::testing
