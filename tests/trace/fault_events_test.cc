// `kolo run --events FILE`: a rank killed by a signal is a "failed" event naming the rank and
// the signal, a rank kolo run stopped is told apart, and `kolo report` shows them.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_kolo.h"
#include "trace_checks.h"

namespace {

using kolo::testing::runKolo;

std::vector<nlohmann::json> readLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(FaultEventsTest, AKilledRankIsAFailedEventWithItsSignal) {
  kolo::testing::TempDir dir;
  const std::string events = dir.path + "/events.jsonl";
  // Rank 1 kills itself with SIGKILL; rank 0 waits until kolo run stops it.
  const auto run = runKolo("run -n 2 --events " + events +
                           " -- sh -c 'if [ \"$KOLO_RANK\" = 1 ]; then kill -KILL $$; fi; exec sleep 60'");
  EXPECT_EQ(run.exitCode, 128 + 9) << run.output;
  const auto lines = readLines(events);
  ASSERT_EQ(lines.size(), 4u) << run.output;
  EXPECT_EQ(lines[0]["event"], "launched");
  EXPECT_EQ(lines[0]["ranks"], 2);
  const nlohmann::json* killed = nullptr;
  const nlohmann::json* stopped = nullptr;
  for (const auto& e : lines) {
    EXPECT_EQ(e["kind"], "event") << e;
    EXPECT_TRUE(e["wall_s"].is_number()) << e;
    if (e["event"] == "failed" && e["rank"] == 1) killed = &e;
    if (e["event"] == "failed" && e["rank"] == 0) stopped = &e;
  }
  ASSERT_NE(killed, nullptr) << run.output;
  EXPECT_EQ((*killed)["signal"], "SIGKILL");
  EXPECT_EQ((*killed)["cause"], "killed by a signal from outside kolo run");
  ASSERT_NE(stopped, nullptr) << run.output;
  EXPECT_EQ((*stopped)["signal"], "SIGTERM");
  EXPECT_EQ((*stopped)["cause"], "stopped by kolo run");
  EXPECT_EQ(lines.back()["event"], "job failed");
  EXPECT_EQ(lines.back()["exit_code"], 137);

  // A second job appends to the same file.
  const auto again = runKolo("run -n 1 --events " + events + " -- true");
  EXPECT_EQ(again.exitCode, 0) << again.output;
  EXPECT_EQ(readLines(events).size(), 6u);

  // kolo report reads the file as the run directory's events: on the terminal and in the page.
  const auto report = runKolo("report " + dir.path + " -o " + dir.path + "/report");
  ASSERT_EQ(report.exitCode, 0) << report.output;
  const std::string name = dir.path.substr(dir.path.rfind('/') + 1);
  EXPECT_NE(report.output.find(name + ": rank 1 failed: SIGKILL (killed by a signal from outside kolo run)"),
            std::string::npos)
      << report.output;
  std::ifstream page(dir.path + "/report/index.html");
  std::stringstream html;
  html << page.rdbuf();
  EXPECT_NE(html.str().find("signal SIGKILL"), std::string::npos);
  EXPECT_NE(html.str().find("stopped by kolo run"), std::string::npos);
}

TEST(FaultEventsTest, AnUnwritableEventsFileIsNamed) {
  const auto run = runKolo("run -n 1 --events /nonexistent/kolo/events.jsonl -- true");
  EXPECT_NE(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("/nonexistent/kolo/events.jsonl"), std::string::npos) << run.output;
}

}  // namespace
