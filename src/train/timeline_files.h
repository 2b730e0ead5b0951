// The timeline of a training run (train::startTimeline, `kolo train --timeline DIR`, or
// KOLO_TIMELINE=DIR): starting the recorder before the job is joined, and at the end writing
// each rank's trace file and merging them on rank 0.
#pragma once

#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/observe.h"

namespace kolo::train::detail {

/// Starts the timeline recorder when `dir` (--timeline) or KOLO_TIMELINE names a directory;
/// the rank's file is also written at exit, so a failed run leaves its spans. Returns the
/// directory ("" when off).
std::string startTimeline(const std::string& dir);

/// Stops recording and writes this rank's trace file; with a communicator of several ranks,
/// waits for every rank's file (a barrier) and rank 0 merges them into DIR/trace.json. The
/// primary process logs where the trace is. Nothing when no timeline was started.
void finishTimeline(comm::Communicator* comm, bool primary, observe::Logger& logger);

}  // namespace kolo::train::detail
