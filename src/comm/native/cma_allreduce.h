// Single-copy all-reduce for ranks that share a host: each rank reduces its slice of the
// vector straight out of its peers' buffers (Linux cross-memory attach, as Open MPI's
// vader does), in cache-sized pieces, then copies the other slices from the peers that
// reduced them. Only a few empty messages travel through the rings.
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

}  // namespace kolo::comm::native
