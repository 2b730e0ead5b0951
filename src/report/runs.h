// What `kolo report` reads from a run directory: the metrics lines of `kolo train --metrics`
// (epoch lines, "interval" lines with the step-time breakdown, "event" lines), the
// checkpoints under it, and any Chrome trace (`--timeline`) it holds.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kolo::cli::report {

/// One run: a directory given to `kolo report`.
struct Run {
  std::string name;  // the directory's name, as legends show it
  std::string dir;
  std::vector<std::string> metricsFiles;
  std::vector<nlohmann::json> epochs;     // lines without "kind" and without "final"
  std::optional<nlohmann::json> final;    // the line with "final": true
  std::vector<nlohmann::json> intervals;  // "kind": "interval"
  std::vector<nlohmann::json> events;     // "kind": "event"
  std::vector<std::pair<int64_t, std::string>> checkpoints;  // step, path
  std::vector<std::string> traces;        // Chrome trace files (*.json with traceEvents)
  /// The first "start" event's field, or `otherwise`.
  std::string startField(const std::string& key, const std::string& otherwise) const;
};

/// Reads `dir`: every *.jsonl file in it (metrics), checkpoints in it or in its
/// subdirectories (ckpt-<step>), trace files (*.json holding "traceEvents"). Throws
/// FileError when `dir` is not a directory or holds no metrics file, FormatError naming the
/// file and line of a line that is not a JSON object.
Run readRun(const std::string& dir);

}  // namespace kolo::cli::report
