// kolo::observe timeline files: merging the ranks' Chrome trace files (trace.rank<R>.json,
// written by kolo/trace.h) into one DIR/trace.json that Perfetto and chrome://tracing open,
// one process per rank on rank 0's clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::observe {

/// What mergeTimeline() wrote.
struct MergedTimeline {
  std::string path;        // DIR/trace.json
  std::vector<int> ranks;  // the ranks found, ascending
  int64_t events = 0;      // trace events written (metadata included)
  int64_t dropped = 0;     // spans the ranks could not keep (their buffers were full)
};

/// Reads every DIR/trace.rank<R>.json and writes DIR/trace.json (through a temporary file):
/// {"traceEvents": [...every rank's...], "displayTimeUnit": "ms", "kolo": {"ranks": [{"rank",
/// "clock_offset_ns", "clock_rtt_ns", "dropped"}...]}}. Throws FileError when DIR holds no
/// rank file, FormatError naming the file that is not a rank's trace, IoError when writing fails.
MergedTimeline mergeTimeline(const std::string& dir);

}  // namespace kolo::observe
