// mergeTimeline: the ranks' Chrome trace files into one DIR/trace.json.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kolo/error.h"
#include "kolo/timeline.h"
#include "observe/rank_files.h"

namespace kolo::observe {

MergedTimeline mergeTimeline(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) KOLO_THROW(FileError, "timeline directory ", dir, " does not exist");
  std::vector<std::pair<int, fs::path>> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (const auto rank = detail::rankOfFile(entry.path().filename().string(), "trace.rank", ".json"))
      files.emplace_back(*rank, entry.path());
  }
  if (files.empty()) KOLO_THROW(FileError, "timeline directory ", dir, " holds no trace.rank<R>.json");
  std::sort(files.begin(), files.end());

  MergedTimeline merged;
  merged.path = (fs::path(dir) / "trace.json").string();
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& [rank, path] : files) {
    std::ifstream in(path);
    nlohmann::json trace = nlohmann::json::parse(in, nullptr, false);
    if (trace.is_discarded() || !trace.is_object() || !trace.contains("traceEvents") ||
        !trace["traceEvents"].is_array())
      KOLO_THROW(FormatError, path.string(), " is not a rank's trace (a JSON object with traceEvents)");
    for (auto& event : trace["traceEvents"]) events.push_back(std::move(event));
    // What the rank says of itself; only a count of dropped events is read from it.
    nlohmann::json info = trace.contains("kolo") && trace["kolo"].is_object() ? trace["kolo"]
                                                                              : nlohmann::json::object();
    info["rank"] = rank;
    const auto dropped = info.find("dropped");
    if (dropped != info.end() && dropped->is_number_unsigned())
      merged.dropped = static_cast<int64_t>(std::min<uint64_t>(
          dropped->get<uint64_t>(), static_cast<uint64_t>(INT64_MAX - merged.dropped))) + merged.dropped;
    ranks.push_back(std::move(info));
    merged.ranks.push_back(rank);
  }
  merged.events = static_cast<int64_t>(events.size());
  nlohmann::json out = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"kolo", {{"ranks", std::move(ranks)}}}};
  const std::string temporary = merged.path + ".tmp";
  {
    std::ofstream file(temporary);
    file << out.dump() << "\n";
    if (!file) KOLO_THROW(IoError, "cannot write the timeline ", temporary, ": ", std::strerror(errno));
  }
  if (std::rename(temporary.c_str(), merged.path.c_str()) != 0)
    KOLO_THROW(IoError, "cannot write the timeline ", merged.path, ": ", std::strerror(errno));
  return merged;
}

}  // namespace kolo::observe
