// Real jobs under `kolo run` (ranks are processes): the merged timeline of `kolo train
// --timeline` and of any program under KOLO_TIMELINE, and the hang diagnosis of a rank that
// skips a collective, of a mismatch, and of a rank stopped with SIGSTOP (the stall watch).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/run_kolo.h"
#include "support/fashion_mnist.h"
#include "trace_checks.h"

namespace {

using kolo::testing::runKolo;

using kolo::testing::expectValidTrace;
using kolo::testing::readJson;
using kolo::testing::TempDir;

TEST(TraceJobTest, TrainTimelineIsOneChromeTraceOfEveryRank) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  const auto run = runKolo("run -n 3 -- " + std::string(KOLO_BINARY_DIR) +
                           "/src/cli/kolo train --strategy multi-worker-mirrored --batch 96 --steps 12 "
                           "--train-limit 1152 --shard-optimizer off --timeline " + dir.path);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const nlohmann::json trace = readJson(dir.path + "/trace.json");
  expectValidTrace(trace);
  std::set<int> pids;
  std::map<std::string, int> names;
  for (const auto& e : trace["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e["pid"] == 1) ++names[e["name"].get<std::string>()];
    if (e["name"] == "allreduce" && e["ph"] == "X") {
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0) << e;
      EXPECT_TRUE(e["args"].contains("seq") && e["args"].contains("detail")) << e;
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));
  for (const char* name : {"step", "data", "forward", "forward 0 Linear", "backward", "gradient sync", "optimizer",
                           "allreduce", "bucket ready", "evaluate"})
    EXPECT_GT(names[name], 0) << name << " missing from rank 1's timeline";
  EXPECT_EQ(names["step"], 12);
  // Clocks: ranks 1 and 2 measured their offset to rank 0 through the store. On one host the
  // clocks are the same, so the offset found is the alignment's error.
  ASSERT_EQ(trace["kolo"]["ranks"].size(), 3u);
  for (const auto& rank : trace["kolo"]["ranks"]) {
    if (rank["rank"] == 0) continue;
    EXPECT_GT(rank["clock_rtt_ns"].get<int64_t>(), 0) << rank;
    EXPECT_LT(std::abs(rank["clock_offset_ns"].get<int64_t>()), 1000000) << rank;
  }
}

TEST(TraceJobTest, AnyProgramRecordsUnderKoloTimeline) {
  TempDir dir;
  const auto run = runKolo("run -n 2 -- " + std::string(KOLO_HANG_PROGRAM) + " ok", "KOLO_TIMELINE=" + dir.path);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("timeline of 2 rank(s) written to " + dir.path + "/trace.json"), std::string::npos)
      << run.output;
  const nlohmann::json trace = readJson(dir.path + "/trace.json");
  expectValidTrace(trace);
  std::map<int, int> allreduces;
  for (const auto& e : trace["traceEvents"])
    if (e["name"] == "allreduce") {
      ++allreduces[e["pid"].get<int>()];
      EXPECT_EQ(e["args"]["bytes"], 4000) << e;
    }
  EXPECT_EQ(allreduces, (std::map<int, int>{{0, 6}, {1, 6}}));
}

TEST(TraceJobTest, HangNamesTheRankThatSkippedACollective) {
  TempDir dir;
  const auto run = runKolo("run -n 3 --timeout 2 --debug-dir " + dir.path + " -- " + KOLO_HANG_PROGRAM + " skip 2 3");
  EXPECT_NE(run.exitCode, 0) << run.output;
  const std::string verdict = "=> rank 2 never entered allreduce #3 (f32 sum count=1000); ranks 0 and 1 wait for it";
  EXPECT_NE(run.output.find(verdict), std::string::npos) << run.output;
  const auto report = runKolo("report hang " + dir.path);
  EXPECT_EQ(report.exitCode, 0) << report.output;
  EXPECT_NE(report.output.find(verdict), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("rank 2: never entered it; its last collective here is allreduce #2"),
            std::string::npos)
      << report.output;
  // What rank 2 was doing instead, from its own stack: sleeping in main.
  EXPECT_NE(report.output.find("its main thread (tid "), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("sleep < main"), std::string::npos) << report.output;
}

TEST(TraceJobTest, HangNamesTheMismatchingPair) {
  TempDir dir;
  const auto run = runKolo("run -n 3 --timeout 20 --debug-dir " + dir.path + " -- " + KOLO_HANG_PROGRAM +
                           " mismatch 1 4");
  EXPECT_NE(run.exitCode, 0) << run.output;
  const auto report = runKolo("report hang " + dir.path);
  EXPECT_EQ(report.exitCode, 0) << report.output;
  EXPECT_NE(report.output.find("=> signatures disagree at collective #4: rank 0 calls allreduce f32 sum "
                               "count=1000 but rank 1 calls allreduce f32 sum count=1001 (the mismatching "
                               "pair: rank 0 and rank 1)"),
            std::string::npos)
      << report.output;
}

TEST(TraceJobTest, StallWatchNamesTheStoppedRank) {
  TempDir dir;
  const auto run = runKolo("run -n 3 --timeout 120 --stall-seconds 1 --debug-dir " + dir.path + " -- " +
                           KOLO_HANG_PROGRAM + " stop 1 2");
  EXPECT_EQ(run.exitCode, 1) << run.output;
  EXPECT_NE(run.output.find("no progress from any rank for 1 s"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("=> rank 1 never entered allreduce #2 (f32 sum count=1000): the process is stopped "
                            "(state T"),
            std::string::npos)
      << run.output;
}

TEST(TraceJobTest, RanksStillStartingAreNotCalledStalled) {
  TempDir dir;
  // Ranks that take 3 s before they open a flight-recorder ring (as ranks loading data on a
  // loaded machine do) are still starting, not stalled: the job ends as they do.
  const auto run = runKolo("run -n 2 --timeout 60 --stall-seconds 1 --debug-dir " + dir.path +
                           " -- sh -c 'sleep 3'");
  EXPECT_EQ(run.exitCode, 0) << run.output;
  EXPECT_EQ(run.output.find("no progress"), std::string::npos) << run.output;
}

TEST(TraceJobTest, ReportHangNamesAMissingDirectory) {
  const auto report = runKolo("report hang /nonexistent/kolo-debug");
  EXPECT_EQ(report.exitCode, 3) << report.output;
  EXPECT_NE(report.output.find("debug directory /nonexistent/kolo-debug does not exist"), std::string::npos)
      << report.output;
}

}  // namespace
