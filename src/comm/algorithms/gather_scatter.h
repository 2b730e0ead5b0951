// Flat gather and scatter over Links: the root exchanges one message with every other rank,
// all posted at once so the transfers proceed in parallel.
#pragma once

#include <cstddef>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// Gathers `bytes` from every rank into root's recvbuf (rank r's block at r * bytes).
/// recvbuf is significant at root only. sendbuf may already be root's block (in place).
void gather(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root);

/// Scatters root's sendbuf (rank r's block at r * bytes) to every rank's recvbuf (bytes).
/// sendbuf is significant at root only; root's recvbuf may be its own block (in place).
void scatter(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root);

}  // namespace kolo::comm::detail
