// What a rank sets up for the observe tools when it joins a job: the flight recorder
// (kolo/flight_recorder.h), the timeline from KOLO_TIMELINE (kolo/trace.h), and the
// timeline's clock, aligned with rank 0's through the store (NTP-style: the best of several
// round trips).
#pragma once

#include <chrono>
#include <string>

#include "kolo/comm/store.h"

namespace kolo::comm::detail {

/// Round trips of the clock exchange; the one with the shortest round trip gives the offset.
inline constexpr int kClockRounds = 16;

/// Collective over the job's ranks (every rank calls it once, after the rendezvous, with
/// the same `prefix`): attaches the flight recorder, starts the timeline when KOLO_TIMELINE
/// is set (written at exit), and when this rank records a timeline measures the offset of
/// its clock to rank 0's through `store` (trace::setClockOffset). Ranks that record no
/// timeline only say so. Throws Timeout when a rank does not take part within `timeout`.
void joinObservers(Store& store, const std::string& prefix, int rank, int size, std::chrono::milliseconds timeout);

/// The clock exchange alone, for rank `rank` of `size`: rank 0 answers the ranks whose key
/// PREFIX/timeline/<r> says "1"; those ranks measure. Returns {offset, round trip} in
/// nanoseconds (rank 0 and ranks that do not measure: {0, 0}).
std::pair<int64_t, int64_t> alignClocks(Store& store, const std::string& prefix, int rank, int size, bool measure,
                                        std::chrono::milliseconds timeout);

}  // namespace kolo::comm::detail
