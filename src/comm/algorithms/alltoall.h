// All-to-all personalised exchange over Links.
#pragma once

#include <cstddef>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// Block j (bytes) of rank i's sendbuf lands in block i of rank j's recvbuf.
/// Out of place: pairwise exchange, step s sends to rank + s and receives from rank - s,
/// so every rank talks to one peer at a time and no scratch is needed. In place
/// (sendbuf == recvbuf): a round-robin pairing where partners swap their blocks through
/// one chunk of scratch.
void alltoall(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
