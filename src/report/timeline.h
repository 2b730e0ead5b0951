// The step-time breakdown of `kolo report` from a run's timeline (`--timeline`, a Chrome
// trace): per rank, the mean time per training step spent waiting for data, computing, in
// communication on any thread, and in communication the stepping thread waited for.
#pragma once

#include <string>
#include <vector>

namespace kolo::cli::report {

/// One rank's means over its "step" spans, in milliseconds per step.
struct RankTimeline {
  int rank = 0;
  int steps = 0;
  double stepMs = 0;
  double dataMs = 0;     // "data" spans on the stepping thread
  double computeMs = 0;  // "compute" spans (forward, backward, optimizer) on it
  double exposedMs = 0;  // "comm" spans on it: communication the step waited for
  double commMs = 0;     // the union of "comm" spans on every thread of the rank, within steps
  double otherMs() const;  // the step less data, compute and exposed communication
};

/// Reads the run's trace files (the merged trace.json when one of them is, else each) and
/// returns one entry per rank that recorded steps, by rank. Spans nested in a counted span
/// of the stepping thread are not counted again. Throws FormatError naming a file that is
/// not a Chrome trace.
std::vector<RankTimeline> timelineBreakdown(const std::vector<std::string>& traceFiles);

}  // namespace kolo::cli::report
