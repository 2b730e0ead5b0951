// Typed element access and closed-form expected values for collective tests: rank r's
// element i is a small integer so every dtype holds it, its sum and its product exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::testing {

inline constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                       DType::I32, DType::I64, DType::U8};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};

/// Rank r's contribution at element i (products stay small: factors 1..3).
inline double contribution(int r, size_t i, ReduceOp op) {
  if (op == ReduceOp::Prod) return static_cast<double>((r + i) % 3 + 1);
  return static_cast<double>(r + 1) + static_cast<double>(i % 5);
}

inline double expectedReduction(int n, size_t i, ReduceOp op, DType dtype) {
  double acc = contribution(0, i, op);
  for (int r = 1; r < n; ++r) {
    const double v = contribution(r, i, op);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) {
    const bool integral = dtype == DType::I32 || dtype == DType::I64 || dtype == DType::U8;
    acc = integral ? std::trunc(acc / n) : acc / n;
  }
  return acc;
}

/// Relative tolerance for comparing a reduced value in dtype.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F16: return 2e-3;
    case DType::BF16: return 1e-2;
    case DType::F32: return 1e-6;
    default: return 0.0;
  }
}

inline bool closeEnough(double got, double want, DType dtype) {
  return std::fabs(got - want) <= tolerance(dtype) * std::max(1.0, std::fabs(want));
}

}  // namespace kolo::comm::testing
