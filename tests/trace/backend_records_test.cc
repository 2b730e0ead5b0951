// Both backends record every operation: `hang_program mixed` (all-reduces, a broadcast, a
// non-blocking all-reduce, blocking and non-blocking sends and receives, a barrier) under
// `kolo run` (native backend) and under `mpirun -np 2` (MPI backend) leaves a timeline with
// a span for each and a flight-recorder dump that lists each, done.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/run_kolo.h"
#include "kolo/hang_report.h"
#include "kolo/timeline.h"
#include "trace_checks.h"

namespace {

using kolo::testing::TempDir;

// What each rank of a 2-rank `hang_program mixed` run must have recorded.
void expectMixedRunRecorded(const std::string& dir, const std::string& output) {
  // The timeline: each rank's file, merged.
  const kolo::observe::MergedTimeline merged = kolo::observe::mergeTimeline(dir + "/tl");
  ASSERT_EQ(merged.ranks, (std::vector<int>{0, 1})) << output;
  const nlohmann::json trace = kolo::testing::readJson(merged.path);
  kolo::testing::expectValidTrace(trace);
  // rank -> name -> spans, complete or asynchronous (the native backend runs a non-blocking
  // collective as a complete span on its progress thread; MPI's is an asynchronous one).
  std::map<int, std::map<std::string, int>> spans;
  std::map<int, int> smallAllreduces;
  for (const auto& e : trace["traceEvents"]) {
    if ((e["ph"] != "X" && e["ph"] != "b") || e["cat"] != "comm") continue;
    const int rank = e["pid"].get<int>();
    const std::string name = e["name"].get<std::string>();
    ++spans[rank][name];
    const auto& args = e["args"];
    if (name == "allreduce") {
      EXPECT_TRUE(args["bytes"] == 4000 || args["bytes"] == 400) << e;
      if (args["bytes"] == 400) ++smallAllreduces[rank];
    }
    if (name == "send" || name == "recv" || name == "isend" || name == "irecv") {
      EXPECT_EQ(args["bytes"], name[0] == 'i' ? 100 : 28) << e;
      EXPECT_EQ(args["peer"], 1 - rank) << e;
      EXPECT_EQ(e["ph"], name[0] == 'i' ? "b" : "X") << e;
    }
    if (name == "allreduce" || name == "broadcast" || name == "barrier") {
      EXPECT_TRUE(args.contains("seq") && args.contains("detail")) << e;
    }
  }
  for (int rank : {0, 1}) {
    for (const auto& [name, count] : std::map<std::string, int>{
             {"allreduce", 7}, {"broadcast", 1}, {"barrier", 1}, {"send", 1}, {"recv", 1}, {"isend", 1}, {"irecv", 1}})
      EXPECT_EQ(spans[rank][name], count) << "rank " << rank << ": " << name;
    EXPECT_EQ(smallAllreduces[rank], 1) << "rank " << rank;
  }
  for (const auto& info : trace["kolo"]["ranks"])
    if (info["rank"] == 1) {
      EXPECT_GT(info["clock_rtt_ns"].get<int64_t>(), 0) << info;
      EXPECT_LT(std::abs(info["clock_offset_ns"].get<int64_t>()), 1000000) << info;
    }

  // The flight recorders: every operation, in order, done; the collectives numbered alike.
  const auto dumps = kolo::observe::loadFlightDumps(dir + "/debug");
  ASSERT_EQ(dumps.size(), 2u) << output;
  for (const auto& d : dumps) {
    EXPECT_EQ(d.reason, "end");
    std::vector<std::string> ops;
    std::vector<int64_t> seqs;
    for (const auto& e : d.entries) {
      EXPECT_EQ(e.state, "done") << d.path << ": " << e.op;
      EXPECT_EQ(e.context, 1u) << e.op;
      ops.push_back(e.op);
      if (e.seq >= 0) seqs.push_back(e.seq);
      if (e.op == "isend" || e.op == "send" || e.op == "irecv" || e.op == "recv") {
        EXPECT_EQ(e.peer, 1 - d.rank) << e.op;
      }
      if (e.op == "allreduce") {
        EXPECT_EQ(e.dtype, "f32");
      }
    }
    const std::vector<std::string> expected = {"allreduce", "allreduce", "allreduce", "allreduce", "allreduce",
                                               "allreduce", "broadcast", "allreduce"};
    ASSERT_GE(ops.size(), expected.size() + 5) << d.path;
    EXPECT_EQ(std::vector<std::string>(ops.begin(), ops.begin() + 8), expected) << d.path;
    EXPECT_EQ(ops.back(), "barrier") << d.path;
    // The point-to-point part: irecv then isend, then send and recv in the rank's order.
    EXPECT_EQ(ops[8], "irecv");
    EXPECT_EQ(ops[9], "isend");
    EXPECT_EQ(ops[10], d.rank == 0 ? "send" : "recv");
    EXPECT_EQ(ops[11], d.rank == 0 ? "recv" : "send");
    ASSERT_EQ(seqs.size(), 9u) << d.path;
    for (size_t i = 1; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], seqs[0] + static_cast<int64_t>(i)) << d.path;
  }
  const auto lines = kolo::observe::diagnoseHang(dumps);
  EXPECT_EQ(lines.back(), "=> no collective is pending: every rank finished every collective it began");
}

TEST(BackendRecordsTest, NativeRecordsCollectivesAndPointToPoint) {
  TempDir dir;
  const auto run = kolo::testing::runKolo("run -n 2 --debug-dir " + dir.path + "/debug -- " +
                                              std::string(KOLO_HANG_PROGRAM) + " mixed",
                                          "KOLO_TIMELINE=" + dir.path + "/tl");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  expectMixedRunRecorded(dir.path, run.output);
}

TEST(BackendRecordsTest, MpiRecordsCollectivesAndPointToPoint) {
#if !KOLO_HAVE_MPI
  GTEST_SKIP() << "kolo was built without the MPI backend";
#else
  if (std::string(KOLO_MPIRUN).empty()) GTEST_SKIP() << "mpirun not found";
  TempDir dir;
  const auto [code, output] = kolo::testing::runShell(
      "env KOLO_TIMELINE=" + dir.path + "/tl KOLO_DEBUG_DIR=" + dir.path + "/debug " +
      // Open MPI keeps process-lifetime allocations that LeakSanitizer would report at exit.
      "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 " +
      "OMPI_MCA_rmaps_base_oversubscribe=1 " + KOLO_MPIRUN + " --allow-run-as-root --oversubscribe -np 2 " +
      KOLO_HANG_PROGRAM + " mixed");
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(output.find("rank 1 done"), std::string::npos) << output;
  expectMixedRunRecorded(dir.path, output);
#endif
}

}  // namespace
