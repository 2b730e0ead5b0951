// Element-wise reduction kernels used by every collective algorithm: acc = acc op in,
// out = a op b, and the final division of an average. They work on raw buffers of any
// kolo dtype; f16 and bf16 are computed in f32 and rounded to nearest even once per op.
#pragma once

#include <cstddef>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::detail {

/// acc[i] = acc[i] op in[i] for i < count. ReduceOp::Avg reduces as Sum; the caller
/// divides once at the end with finishAvg. Integer sum and product wrap around in the
/// element type (two's complement for i32/i64, modulo 256 for u8). Min and max keep the
/// accumulated value unless the incoming one compares strictly smaller (larger), so a NaN
/// already in acc stays and an incoming NaN is ignored. acc and in must not overlap
/// partially (acc == in is allowed). f32 and f64 loops are vectorised, with an AVX2 path
/// chosen at run time; f16 uses F16C where the CPU has it. Never throws except
/// InvalidArgument for an unknown dtype or op code.
void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);

/// out[i] = a[i] op b[i]: the three-operand form, saving a copy when the result goes to a
/// third buffer (out-of-place collectives). out may be a or b exactly; no partial overlap.
/// Same rules as reduceInto.
void reduceTo(void* out, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

/// Divides every element by n, completing an average whose sum was reduced with Avg.
/// Floating types divide in their own precision (f16/bf16 in f32, then round); integer
/// types use C++ integer division (truncation toward zero) of the wrapped sum. n >= 1.
void finishAvg(void* buf, size_t count, DType dtype, int n);

/// finishAvg(buf, count, dtype, n) when op is Avg; nothing otherwise.
void finishReduction(void* buf, size_t count, DType dtype, ReduceOp op, int n);

/// Multiplies every element by factor (in f64 for f64, in f32 otherwise). Floating types
/// only: InvalidArgument for integer dtypes.
void scaleInPlace(void* buf, size_t count, DType dtype, double factor);

/// Whether the kernels run their AVX2/F16C path on this CPU (for tests and reports).
bool reduceKernelsUseAvx2();

/// reduceTo on the baseline-ISA path whatever the CPU, so tests can check both paths.
void reduceToPortable(void* out, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

}  // namespace kolo::comm::detail
