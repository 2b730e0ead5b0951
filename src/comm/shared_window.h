// SharedWindow over shared memory, for any backend whose group is on one host: one unnamed
// file per rank (comm/shm_file.h), mapped by every rank through /proc/<pid>/fd after the
// communicator's allgather of (pid, fd); there is never a name in /dev/shm to leave behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kolo/comm/communicator.h"

namespace kolo::comm::detail {

/// Collective over `comm`, whose ranks the caller knows to share this host: maps a
/// window of `bytes` per rank, or returns nullptr on every rank when a rank could not
/// create or map its part (not enough shared memory, /proc not readable). `tag` labels the
/// files in /proc/<pid>/maps.
std::shared_ptr<SharedWindow> allocatePosixSharedWindow(Communicator& comm, size_t bytes,
                                                        uint64_t tag);

}  // namespace kolo::comm::detail
