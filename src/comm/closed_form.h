// The values collectives are checked against: each rank fills its buffers from a formula
// of (rank, index) and the expected result is known in closed form. The comm tests, the
// MPI tests, `kolo bench --check` and bench/soak all use these, so a result means the same
// everywhere. Inputs and results are small positive integers (or halves, for an average),
// exact in every dtype up to the rank counts closedFormTolerance names.
#pragma once

#include <cstddef>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::detail {

inline constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                       DType::I32, DType::I64, DType::U8};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                                             ReduceOp::Avg};

/// A value no input, code or result takes (in u8 it reads 255, which only a sum that
/// wraps past 255 reaches): outputs are filled with it to catch elements never written.
inline constexpr double kClosedFormSentinel = -1;

/// Element i of rank `rank`'s input to a reduction by `op` over `ranks` ranks: for sum,
/// min, max and avg (rank + 1) + i mod 7; for prod 2 on min(ranks, i mod 4) ranks (which
/// ones turns with i) and 1 on the others, so products stay at most 8.
double closedFormInput(ReduceOp op, int rank, int ranks, size_t i);

/// Element i of the reduction of closedFormInput(op, 0..ranks-1, i) as a correct reduction
/// leaves it in dtype: sum n(n+1)/2 + n (i mod 7), min 1 + i mod 7, max n + i mod 7,
/// prod 2^min(n, i mod 4), avg the sum divided once in the element type (f32 for f16 and
/// bf16, integers truncate). Integer sums wrap in the element type, as the kernels do.
double closedFormResult(ReduceOp op, int ranks, size_t i, DType dtype);

/// Element i that rank `src` sends towards rank `dst` in a collective that moves data
/// (broadcast, gathers, scatter, all-to-all): 1 + (59 src + 223 dst + i) mod 251, exact in
/// every dtype and never 0, so a buffer left zeroed shows.
double closedFormCode(int src, int dst, size_t i);

/// Relative error allowed between a reduced element and closedFormResult over `ranks`
/// ranks: 0 while every partial sum is an integer the dtype holds exactly (f16 up to 57
/// ranks, bf16 up to 17, f32 and f64 far beyond, integers always); past that, room for
/// the rounding of a sum taken in any order.
double closedFormTolerance(DType dtype, int ranks);

/// Whether `got` is `want` within closedFormTolerance(dtype, ranks).
bool closedFormMatches(double got, double want, DType dtype, int ranks);

/// Stores closedFormInput(op, rank, ranks, first + j) as element j < count of `buf`.
void fillClosedFormInput(void* buf, DType dtype, size_t count, ReduceOp op, int rank, int ranks, size_t first = 0);

/// Stores closedFormResult(op, ranks, first + j, dtype) as element j < count of `buf`.
void fillClosedFormResult(void* buf, DType dtype, size_t count, ReduceOp op, int ranks, size_t first = 0);

/// "" when element j < count of `buf` matches closedFormResult(op, ranks, first + j, dtype)
/// for every j, otherwise the first element that does not: its index, value and the
/// value wanted.
std::string closedFormMismatch(const void* buf, DType dtype, size_t count, ReduceOp op, int ranks,
                               size_t first = 0);

}  // namespace kolo::comm::detail
