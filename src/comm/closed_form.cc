// Closed-form inputs and results of collectives (closed_form.h).
#include "comm/closed_form.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

namespace kolo::comm::detail {
namespace {

/// The largest partial result of any reduction of the inputs over n ranks: the full sum.
double largestSum(int n) { return n * (n + 1) / 2.0 + 6.0 * n; }

/// Largest integer below which every integer is exact in a floating dtype.
double exactIntegers(DType dtype) {
  switch (dtype) {
    case DType::F16: return 2048;
    case DType::BF16: return 256;
    case DType::F32: return 16777216;
    case DType::F64: return 9007199254740992.0;
    default: return std::numeric_limits<double>::infinity();  // integers wrap as the kernels do
  }
}

/// The integer `sum` after wrapping in an integer dtype.
int64_t wrapped(int64_t sum, DType dtype) {
  switch (dtype) {
    case DType::U8: return sum & 0xff;
    case DType::I32: return static_cast<int32_t>(static_cast<uint32_t>(sum));
    default: return sum;
  }
}

bool integral(DType dtype) { return dtype == DType::I32 || dtype == DType::I64 || dtype == DType::U8; }

/// `value` as dtype holds it (rounded to nearest even in the floating types).
double inDType(double value, DType dtype) {
  uint64_t element = 0;
  storeElement(dtype, &element, 0, value);
  return loadElement(dtype, &element, 0);
}

double exactResult(ReduceOp op, int ranks, size_t i, DType dtype) {
  const int64_t n = ranks;
  const int64_t m = static_cast<int64_t>(i % 7);
  const int64_t sum = n * (n + 1) / 2 + n * m;
  switch (op) {
    case ReduceOp::Sum: return static_cast<double>(integral(dtype) ? wrapped(sum, dtype) : sum);
    case ReduceOp::Min: return static_cast<double>(1 + m);
    case ReduceOp::Max: return static_cast<double>(n + m);
    case ReduceOp::Prod: return static_cast<double>(int64_t{1} << std::min<int64_t>(n, static_cast<int64_t>(i % 4)));
    case ReduceOp::Avg:
      switch (dtype) {
        case DType::F64: return static_cast<double>(sum) / static_cast<double>(n);
        case DType::F32:
        case DType::F16:
        case DType::BF16: return static_cast<float>(sum) / static_cast<float>(n);
        default: return static_cast<double>(wrapped(sum, dtype) / n);
      }
  }
  return 0;
}

}  // namespace

double closedFormInput(ReduceOp op, int rank, int ranks, size_t i) {
  if (op == ReduceOp::Prod) {
    const size_t turned = (static_cast<size_t>(rank) + i) % static_cast<size_t>(ranks);
    return turned < i % 4 ? 2.0 : 1.0;
  }
  return static_cast<double>(rank + 1) + static_cast<double>(i % 7);
}

double closedFormResult(ReduceOp op, int ranks, size_t i, DType dtype) {
  return inDType(exactResult(op, ranks, i, dtype), dtype);
}

double closedFormCode(int src, int dst, size_t i) {
  // 251 is the largest prime a byte holds; with these factors no two (src, dst) pairs of
  // up to 8 ranks share a code at indices less than 3 apart.
  return static_cast<double>(1 + (static_cast<size_t>(src) * 59 + static_cast<size_t>(dst) * 223 + i) % 251);
}

double closedFormTolerance(DType dtype, int ranks) {
  if (largestSum(ranks) <= exactIntegers(dtype)) return 0;
  switch (dtype) {
    case DType::F32: return 1e-5;
    case DType::F64: return 1e-12;
    case DType::F16: return 4e-3;
    case DType::BF16: return 2e-2;
    default: return 0;
  }
}

bool closedFormMatches(double got, double want, DType dtype, int ranks) {
  return got == want || std::fabs(got - want) <= closedFormTolerance(dtype, ranks) * std::fabs(want);
}

void fillClosedFormInput(void* buf, DType dtype, size_t count, ReduceOp op, int rank, int ranks, size_t first) {
  for (size_t j = 0; j < count; ++j) storeElement(dtype, buf, j, closedFormInput(op, rank, ranks, first + j));
}

void fillClosedFormResult(void* buf, DType dtype, size_t count, ReduceOp op, int ranks, size_t first) {
  for (size_t j = 0; j < count; ++j) storeElement(dtype, buf, j, closedFormResult(op, ranks, first + j, dtype));
}

std::string closedFormMismatch(const void* buf, DType dtype, size_t count, ReduceOp op, int ranks, size_t first) {
  for (size_t j = 0; j < count; ++j) {
    const double got = loadElement(dtype, buf, j);
    const double want = closedFormResult(op, ranks, first + j, dtype);
    if (closedFormMatches(got, want, dtype, ranks)) continue;
    std::ostringstream message;
    message << dtypeName(dtype) << " " << reduceOpName(op) << " over " << ranks << " ranks, element " << j << " of "
            << count << ": got " << got << ", want " << want;
    return message.str();
  }
  return "";
}

}  // namespace kolo::comm::detail
