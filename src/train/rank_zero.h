// Loading a state on rank 0 and telling every rank whether it could, before any state moves:
// what an engine's and a loop's checkpoint loading share, so that a rank 0 that fails makes
// every rank throw instead of leaving the others waiting in a broadcast.
#pragma once

#include <functional>
#include <string>

#include "kolo/comm/communicator.h"

namespace kolo::train::detail {

/// Runs `load` on rank `rank` 0 (of `comm`; null: this process alone) and broadcasts whether
/// it succeeded. Rank 0 rethrows what `load` threw (a kolo::Error); the other ranks throw
/// PeerError saying that rank 0 could not `what`. Blocking; collective over `comm`.
void loadOnRankZero(comm::Communicator* comm, int rank, const std::function<void()>& load,
                    const std::string& what);

}  // namespace kolo::train::detail
