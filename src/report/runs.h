// What `kolo report` reads from a run directory: the metrics lines of `kolo train --metrics`
// (epoch lines, "interval" lines with the step-time breakdown, "event" lines), the
// checkpoints under it, and any Chrome trace (`--timeline`) it holds.
#pragma once

#include <cstdint>
#include <istream>
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

// Fields of a metrics line, which may hold anything: the value when it has the type the
// writer gives it, `otherwise` when it is absent or has another type.
std::string textField(const nlohmann::json& record, const char* key, const std::string& otherwise = "");
/// An integer within int's range.
int intField(const nlohmann::json& record, const char* key, int otherwise);
double numberField(const nlohmann::json& record, const char* key, double otherwise);

/// Adds the metrics lines of `in` (read from `source`) to `run` (metrics_lines.cc, apart
/// from the directory reading so that fuzz/report_fuzz.cc drives it). A blank line is
/// skipped, and so is a partial last line (a run killed mid-write). FormatError naming
/// `source` and the line when a line is not a JSON object, or its "kind", "event" or "final"
/// has another type than the metrics writer gives it.
void readMetricsLines(std::istream& in, const std::string& source, Run& run);

/// Reads `dir`: every *.jsonl file in it (metrics), checkpoints in it or in its
/// subdirectories (ckpt-<step>), trace files (*.json holding "traceEvents"). Throws
/// FileError when `dir` is not a directory or holds no metrics file, FormatError naming the
/// file and line of a line that is not a JSON object.
Run readRun(const std::string& dir);

}  // namespace kolo::cli::report
