// The hang diagnosis on dumps made by hand: a rank that never entered a collective, a
// mismatch, a stopped rank, and a job where nothing is pending.
#include <gtest/gtest.h>

#include <algorithm>

#include "kolo/error.h"
#include "kolo/hang_report.h"

namespace {

using namespace kolo::observe;

constexpr int64_t kSecond = 1000000000;

FlightEntry allreduce(int rank, int64_t seq, const std::string& state, int64_t count = 1000) {
  FlightEntry e;
  e.id = static_cast<uint64_t>(seq + 1);
  e.seq = seq;
  e.context = 1;
  e.groupRank = rank;
  e.groupSize = 3;
  e.op = "allreduce";
  e.dtype = "f32";
  e.reduce = "sum";
  e.algorithm = "auto";
  e.count = count;
  e.state = state;
  e.queuedNs = e.startedNs = (seq + 1) * kSecond;
  if (state == "done") e.finishedNs = e.startedNs + kSecond / 10;
  return e;
}

FlightDump dumpOf(int rank, int64_t upTo, const std::string& lastState) {
  FlightDump d;
  d.rank = rank;
  d.worldSize = 3;
  d.reason = "timeout";
  d.dumpNs = 20 * kSecond;
  for (int64_t s = 0; s <= upTo; ++s) d.entries.push_back(allreduce(rank, s, s == upTo ? lastState : "done"));
  return d;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

TEST(HangReportTest, NamesTheRankThatNeverEnteredTheCollective) {
  std::vector<FlightDump> dumps = {dumpOf(0, 3, "started"), dumpOf(1, 3, "failed"), dumpOf(2, 2, "done")};
  dumps[1].entries.back().error = "allreduce #3 on rank 1: no data from rank 2 after 2 s";
  FlightEntry send;
  send.id = 10;
  send.context = 1;
  send.op = "send";
  send.dtype = "f32";
  send.count = 4;
  send.peer = 0;
  send.state = "started";
  dumps[2].entries.push_back(send);
  const std::string text = joined(diagnoseHang(dumps));
  EXPECT_NE(text.find("collective allreduce #3 (f32 sum count=1000) is not complete"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2: never entered it; its last collective here is allreduce #2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("since then: send to rank 0 (f32 count=4) (started)"), std::string::npos) << text;
  EXPECT_EQ(text.find("its main thread"), std::string::npos) << text;  // rank 2's dump has no stacks
  dumps[2].pid = 42;
  dumps[2].stacks = {{43, "worker", true, {"read (libc.so.6)"}},
                     {42, "prog", true, {"nanosleep (libc.so.6)", "computeSomething(int) (prog)", "main (prog)"}}};
  const std::string withStacks = joined(diagnoseHang(dumps));
  EXPECT_NE(withStacks.find("    its main thread (tid 42) was in: nanosleep < computeSomething < main\n"),
            std::string::npos)
      << withStacks;
  EXPECT_NE(text.find("=> rank 2 never entered allreduce #3 (f32 sum count=1000); ranks 0 and 1 wait for it"),
            std::string::npos)
      << text;
}

TEST(HangReportTest, NamesTheMismatchingPair) {
  std::vector<FlightDump> dumps = {dumpOf(0, 4, "failed"), dumpOf(1, 4, "failed"), dumpOf(2, 4, "failed")};
  dumps[2].entries.back().count = 1001;
  const std::string text = joined(diagnoseHang(dumps));
  EXPECT_NE(text.find("=> signatures disagree at collective #4: rank 0 calls allreduce f32 sum count=1000 but "
                      "rank 2 calls allreduce f32 sum count=1001 (the mismatching pair: rank 0 and rank 2)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("never entered"), std::string::npos) << text;
}

TEST(HangReportTest, NamesAStoppedRankAndOneWithoutDump) {
  std::vector<FlightDump> dumps = {dumpOf(0, 5, "started"), dumpOf(1, 4, "done")};
  dumps[1].note = "did not answer SIGUSR1; the process is stopped (state T: SIGSTOP or a job-control signal)";
  const std::string text = joined(diagnoseHang(dumps, 3));
  EXPECT_NE(text.find("no flight recorder from rank 2"), std::string::npos) << text;
  EXPECT_NE(text.find("=> rank 1 never entered allreduce #5 (f32 sum count=1000): the process is stopped (state T"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("=> rank 2 never entered allreduce #5"), std::string::npos) << text;
}

TEST(HangReportTest, SaysWhenNothingIsPending) {
  const std::string text = joined(diagnoseHang({dumpOf(0, 2, "done"), dumpOf(1, 2, "done")}));
  EXPECT_NE(text.find("=> no collective is pending"), std::string::npos) << text;
}

TEST(HangReportTest, BadDirectoriesAreNamed) {
  try {
    loadFlightDumps("/nonexistent/kolo-debug");
    FAIL() << "no exception";
  } catch (const kolo::FileError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kolo-debug does not exist"), std::string::npos);
  }
}

}  // namespace
