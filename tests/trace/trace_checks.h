// Helpers of the timeline and flight-recorder job tests: a temporary directory, JSON files,
// a shell command's output, and the check that a Chrome trace is well formed.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kolo::testing {

struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/kolo-trace-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

inline nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

/// Runs `command` through the shell; its exit code and its output (stdout and stderr).
inline std::pair<int, std::string> runShell(const std::string& command) {
  std::string output;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, output};
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

/// Every event has the trace-event fields; complete events of one thread nest; every
/// asynchronous begin ("b") has one end ("e") of the same id and name, not before it.
inline void expectValidTrace(const nlohmann::json& trace) {
  ASSERT_TRUE(trace["traceEvents"].is_array());
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> spans;  // (pid, tid) -> (ts, end)
  std::map<std::pair<int, int64_t>, std::pair<std::string, double>> asyncOpen;  // (pid, id) -> (name, ts)
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("name") && e.contains("pid") && e.contains("tid")) << e;
    if (e["ph"] == "M") continue;
    ASSERT_TRUE(e["ts"].is_number()) << e;
    if (e["ph"] == "X") {
      ASSERT_TRUE(e["dur"].is_number() && e["dur"].get<double>() >= 0) << e;
      spans[{e["pid"], e["tid"]}].emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
    } else if (e["ph"] == "b") {
      ASSERT_TRUE(e["id"].is_number() && e.contains("cat")) << e;
      const bool fresh =
          asyncOpen.emplace(std::make_pair(e["pid"].get<int>(), e["id"].get<int64_t>()),
                            std::make_pair(e["name"].get<std::string>(), e["ts"].get<double>()))
              .second;
      ASSERT_TRUE(fresh) << "async id used twice: " << e;
    } else if (e["ph"] == "e") {
      auto it = asyncOpen.find({e["pid"].get<int>(), e["id"].get<int64_t>()});
      ASSERT_TRUE(it != asyncOpen.end()) << "async end without begin: " << e;
      EXPECT_EQ(it->second.first, e["name"].get<std::string>()) << e;
      EXPECT_GE(e["ts"].get<double>(), it->second.second) << e;
      asyncOpen.erase(it);
    } else {
      ASSERT_EQ(e["ph"], "i") << e;
    }
  }
  EXPECT_TRUE(asyncOpen.empty()) << asyncOpen.size() << " async begin(s) without an end";
  constexpr double kSlack = 0.002;  // microseconds: the decimal rounding of ts + dur
  for (auto& [thread, list] : spans) {
    std::sort(list.begin(), list.end(), [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<std::pair<double, double>> open;
    for (const auto& span : list) {
      while (!open.empty() && open.back().second <= span.first + kSlack) open.pop_back();
      if (!open.empty()) {
        ASSERT_LE(span.second, open.back().second + kSlack)
            << "pid " << thread.first << " tid " << thread.second << ": span [" << span.first << ", " << span.second
            << "] overlaps its enclosing span [" << open.back().first << ", " << open.back().second << "]";
      }
      open.push_back(span);
    }
  }
}

}  // namespace kolo::testing
