// What a rank of an MPI job sets up for the observe tools when its first world communicator
// is made: the flight recorder, the timeline from KOLO_TIMELINE, and the timeline's clock
// aligned with rank 0's through MPI messages (the native backend does the same through the
// store, comm/observers.h).
#pragma once

#if KOLO_HAVE_MPI

#include <cstdint>

#include "kolo/comm/communicator.h"

namespace kolo::comm::detail {

/// Collective over `world` (every rank calls it once per world communicator made). The first
/// call of the process attaches the flight recorder, starts the timeline when KOLO_TIMELINE is
/// set (written at exit) and, when any rank records a timeline, measures this rank's clock
/// offset to rank 0's: NTP-style ping-pongs over `world`'s send and receive (each bounded by
/// its timeout), the shortest round trip of kClockRounds kept. Later calls change nothing.
/// Returns the context id that names the new world communicator in the flight recorder: 1
/// for the first, another value (equal on every rank) for later ones.
uint32_t joinMpiObservers(Communicator& world);

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
