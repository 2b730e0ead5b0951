// Direct (one message per pair) collectives over Links: every rank talks to every other
// rank once. The all-reduce is latency-optimal for small messages on a few ranks and
// reduces in rank order, so every rank gets bit-identical results; the all-gather serves
// split(), which must not depend on any tunable algorithm.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/links.h"
#include "kolo/comm/communicator.h"

namespace kolo::comm::native {

/// Every rank sends its vector to every other and reduces all n in rank order. `scratch`
/// holds the incoming vectors (grown as needed, kept by the caller between calls).
void directAllreduce(detail::Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                     ReduceOp op, std::vector<char>& scratch);
/// Rank r's blockBytes[r] bytes from sendbuf land at their offset of every recvbuf.
void directAllgatherv(detail::Links& links, const void* sendbuf, void* recvbuf, const std::vector<size_t>& blockBytes);

}  // namespace kolo::comm::native
