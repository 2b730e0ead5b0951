// Single-copy all-reduce for ranks that share a host: each rank reduces its slice of the
// vector straight out of its peers' buffers (Linux cross-memory attach, as Open MPI's
// vader uses), in cache-sized pieces, and writes each finished piece into every peer's
// result buffer while it is still in cache. Only the buffer addresses and one empty
// message per pair travel through the rings.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/native/group_links.h"

namespace kolo::comm::native {

/// All-reduce through process_vm_readv. pids[r] is group rank r's process id (ranks that
/// are threads of this process are read with memcpy). Every rank must be on this host.
/// Throws IoError naming the rank whose memory could not be read.
void cmaAllreduce(GroupLinks& links, const std::vector<int>& pids, const void* sendbuf, void* recvbuf, size_t count,
                  DType dtype, ReduceOp op);

/// Reads `bytes` at `remote` in process pid into local (memcpy when pid is this process).
/// Returns false (errno set) when the kernel refuses.
bool readPeerMemory(int pid, void* local, const void* remote, size_t bytes);
/// Writes `bytes` from local to `remote` in process pid; false (errno set) when refused.
bool writePeerMemory(int pid, void* remote, const void* local, size_t bytes);

}  // namespace kolo::comm::native
