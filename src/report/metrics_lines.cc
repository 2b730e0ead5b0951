// The metrics lines of a run for `kolo report` (runs.h): each line a JSON object, sorted by
// its "kind". The file may come from anywhere, so a line is refused with its place named
// when the fields that sort it have types the writer never gives them.
#include <climits>
#include <string>

#include "kolo/error.h"
#include "report/runs.h"

namespace kolo::cli::report {
namespace {

/// Whether `record` has `key` of another type than the test `is` (json::is_string...) wants.
bool mistyped(const nlohmann::json& record, const char* key,
              bool (nlohmann::json::*is)() const noexcept) {
  const auto it = record.find(key);
  return it != record.end() && !((*it).*is)();
}

}  // namespace

std::string textField(const nlohmann::json& record, const char* key, const std::string& otherwise) {
  const auto it = record.find(key);
  return it != record.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

int intField(const nlohmann::json& record, const char* key, int otherwise) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number_integer()) return otherwise;
  if (it->is_number_unsigned()) {
    const auto value = it->get<uint64_t>();
    return value <= static_cast<uint64_t>(INT_MAX) ? static_cast<int>(value) : otherwise;
  }
  const auto value = it->get<int64_t>();
  return value >= INT_MIN && value <= INT_MAX ? static_cast<int>(value) : otherwise;
}

double numberField(const nlohmann::json& record, const char* key, double otherwise) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : otherwise;
}

std::string Run::startField(const std::string& key, const std::string& otherwise) const {
  for (const nlohmann::json& e : events) {
    if (e.value("event", "") != "start" && e.value("event", "") != "resume") continue;
    if (!e.contains(key)) continue;
    return e[key].is_string() ? e[key].get<std::string>() : e[key].dump();
  }
  return otherwise;
}

void readMetricsLines(std::istream& in, const std::string& source, Run& run) {
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    // A run killed mid-write leaves a partial last line: skip it, as the metrics writer
    // promises whole lines only up to a crash.
    if (record.is_discarded() && in.peek() == EOF) break;
    if (record.is_discarded() || !record.is_object())
      KOLO_THROW(FormatError, "kolo report: ", source, ":", number,
                 " is not a JSON object (a metrics line of FitOptions::metricsPath)");
    if (mistyped(record, "kind", &nlohmann::json::is_string) ||
        mistyped(record, "event", &nlohmann::json::is_string) ||
        mistyped(record, "final", &nlohmann::json::is_boolean))
      KOLO_THROW(FormatError, "kolo report: ", source, ":", number,
                 " has a \"kind\" or \"event\" that is not a string, or a \"final\" that is not",
                 " true or false");
    const std::string kind = record.value("kind", "");
    if (kind == "interval") {
      run.intervals.push_back(std::move(record));
    } else if (kind == "event") {
      run.events.push_back(std::move(record));
    } else if (kind.empty() && record.value("final", false)) {
      run.final = std::move(record);
    } else if (kind.empty() && record.contains("epoch")) {
      run.epochs.push_back(std::move(record));
    }
  }
}

}  // namespace kolo::cli::report
