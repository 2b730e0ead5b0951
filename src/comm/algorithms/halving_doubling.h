// Recursive halving-doubling all-reduce (Rabenseifner; Thakur, Rabenseifner & Gropp 2005):
// reduce-scatter by recursive halving, then all-gather by recursive doubling, over the
// largest power of two p <= n ranks; the n - p extra ranks fold their data into a partner
// first and receive the result from it last. Small vectors use recursive doubling
// (whole-vector exchanges, log2 p steps) instead.
#pragma once

#include <cstddef>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// Halving-doubling all-reduce of count elements. In place when sendbuf == recvbuf.
/// Latency 2 log2 p (+2 when n is not a power of two) steps, bandwidth 2(p-1)/p of the
/// vector per rank; at or below opts.recursiveDoublingBytes (or count < p): log2 p steps
/// with whole-vector exchanges and scratch of that size. Operands are combined lower
/// rank first, so every rank ends with bit-identical results. Avg divides by links.size().
void halvingDoublingAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                              ReduceOp op, const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
