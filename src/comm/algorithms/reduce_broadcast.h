// Reduce-to-one + broadcast all-reduce: the baseline flat algorithm. Rank 0 receives every
// other rank's vector (chunk by chunk, combining in rank order) and sends the result back
// to each. Simple and latency-friendly for two or three ranks; root bandwidth-bound beyond.
#pragma once

#include <cstddef>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// Flat all-reduce through rank 0. In place when sendbuf == recvbuf. Scratch: a few chunks
/// per peer at rank 0. Avg divides once at rank 0, by links.size().
void reduceBroadcastAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                              ReduceOp op, const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
