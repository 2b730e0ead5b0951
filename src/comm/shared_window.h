// SharedWindow over POSIX shared memory, for any backend whose group is on one host: one
// object per rank, mapped by every rank; names travel by the communicator's allgather and
// are unlinked as soon as every rank has mapped them, so nothing is left in /dev/shm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kolo/comm/communicator.h"

namespace kolo::comm::detail {

/// Collective over `comm`, whose ranks the caller knows to share this host: maps a
/// window of `bytes` per rank, or returns nullptr on every rank when a rank could not
/// create or map its part. `tag` makes the object names unique within the process.
std::shared_ptr<SharedWindow> allocatePosixSharedWindow(Communicator& comm, size_t bytes,
                                                        uint64_t tag);

}  // namespace kolo::comm::detail
