// timelineBreakdown: for each rank, the thread that records "step" spans; inside each step,
// its outermost data, compute and comm spans are summed by category (a span inside another
// counted one, such as a module's forward inside "forward", is not counted again), and the
// comm spans of every thread of the rank (the progress thread's all-reduces) are merged into
// one union, clipped to the step.
#include "report/timeline.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "kolo/error.h"

namespace kolo::cli::report {
namespace {

struct Interval {
  double begin = 0, end = 0;  // microseconds
  std::string category;
};

// Length of the union of `spans` clipped to [from, to].
double unionWithin(std::vector<std::pair<double, double>> spans, double from, double to) {
  for (auto& s : spans) s = {std::max(s.first, from), std::min(s.second, to)};
  std::sort(spans.begin(), spans.end());
  double total = 0, reach = from;
  for (const auto& [b, e] : spans) {
    if (e <= b) continue;
    const double start = std::max(b, reach);
    if (e > start) total += e - start;
    reach = std::max(reach, e);
  }
  return total;
}

/// The event's string field `key`, or "" when it is absent or not a string.
std::string text(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : "";
}

/// The event's integer field `key` within [least, most], or none (absent, another type, out
/// of range).
std::optional<int64_t> integer(const nlohmann::json& e, const char* key, int64_t least, int64_t most) {
  const auto it = e.find(key);
  if (it == e.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  const auto value = it->get<int64_t>();
  if (value < least || value > most) return std::nullopt;
  return value;
}

}  // namespace

double RankTimeline::otherMs() const { return std::max(0.0, stepMs - dataMs - computeMs - exposedMs); }

std::vector<RankTimeline> timelineBreakdown(const std::vector<std::string>& traceFiles) {
  std::vector<std::string> files;
  for (const std::string& f : traceFiles)
    if (std::filesystem::path(f).filename() == "trace.json") files = {f};
  if (files.empty()) files = traceFiles;

  // pid -> tid -> spans; pid -> comm spans of every thread; pid -> the stepping thread's steps.
  std::map<int, std::map<int64_t, std::vector<Interval>>> threads;
  std::map<int, std::vector<std::pair<double, double>>> comm;
  std::map<int, std::map<int64_t, std::vector<std::pair<double, double>>>> steps;
  for (const std::string& file : files) {
    std::ifstream in(file);
    const nlohmann::json trace = nlohmann::json::parse(in, nullptr, false);
    if (trace.is_discarded() || !trace.is_object() || !trace.contains("traceEvents") ||
        !trace["traceEvents"].is_array())
      KOLO_THROW(FormatError, "kolo report: ", file, " is not a Chrome trace (a JSON object with traceEvents)");
    // Events other than complete ones ("X") with numeric times and integer ids are passed
    // over, whatever else they hold.
    for (const nlohmann::json& e : trace["traceEvents"]) {
      if (!e.is_object() || text(e, "ph") != "X" || !e.contains("ts") || !e.contains("dur") ||
          !e["ts"].is_number() || !e["dur"].is_number())
        continue;
      const auto pid = integer(e, "pid", INT_MIN, INT_MAX);
      const auto tid = e.contains("tid") ? integer(e, "tid", INT64_MIN, INT64_MAX) : int64_t{0};
      if (!pid || !tid) continue;
      const double begin = e["ts"].get<double>(), end = begin + e["dur"].get<double>();
      const std::string category = text(e, "cat");
      const std::string name = text(e, "name");
      const int rank = static_cast<int>(*pid);
      if (name == "step" && category == "train") steps[rank][*tid].emplace_back(begin, end);
      if (category == "comm") comm[rank].emplace_back(begin, end);
      if (category == "data" || category == "compute" || category == "comm")
        threads[rank][*tid].push_back({begin, end, category});
    }
  }

  std::vector<RankTimeline> out;
  for (auto& [pid, byThread] : steps) {
    // The stepping thread: the one with the most steps.
    auto stepping = std::max_element(byThread.begin(), byThread.end(),
                                     [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    std::vector<Interval>& spans = threads[pid][stepping->first];
    std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    RankTimeline r;
    r.rank = pid;
    for (const auto& [from, to] : stepping->second) {
      ++r.steps;
      r.stepMs += to - from;
      double reach = from;  // the end of the last outermost span counted
      for (const Interval& s : spans) {
        if (s.begin < from || s.end > to || s.begin < reach) continue;
        reach = s.end;
        const double length = s.end - s.begin;
        (s.category == "data" ? r.dataMs : s.category == "compute" ? r.computeMs : r.exposedMs) += length;
      }
      r.commMs += unionWithin(comm[pid], from, to);
    }
    if (r.steps == 0) continue;
    for (double* v : {&r.stepMs, &r.dataMs, &r.computeMs, &r.exposedMs, &r.commMs}) *v /= 1e3 * r.steps;
    out.push_back(r);
  }
  return out;
}

}  // namespace kolo::cli::report
