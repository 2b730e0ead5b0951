// A data-parallel engine's communication-hook state in checkpoints: every rank's state moves
// to rank 0, which writes the checkpoint, and back on resume.
#pragma once

#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/parallel/strategy.h"

namespace kolo::train::detail {

/// Collective over `comm` (may be null: one process): rank 0 gets every rank's hook state,
/// named "compress.rank<R>.<entry>", for its checkpoint; other ranks get nothing. Empty
/// without a hook or state.
parallel::NamedTensors gatherCompressionState(comm::Communicator* comm,
                                              parallel::Strategy& strategy);

/// Collective: hands each rank its part of `saved` (rank 0's checkpoint tensors; ignored
/// elsewhere) and loads it into its hook. Throws Mismatch on every rank when the checkpoint
/// holds hook state for another number of ranks or none while a lossy hook is installed
/// after compressed steps, or holds state while no hook is installed.
void scatterCompressionState(comm::Communicator* comm, parallel::Strategy& strategy,
                             const parallel::NamedTensors& saved);

}  // namespace kolo::train::detail
