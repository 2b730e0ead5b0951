// comm::benchmarkCollective called from a program, ranks as threads over the native
// communicator: every collective gives correct results at 2 and 3 ranks, with the bytes
// and count of nccl-tests' conventions and the same figures on every rank; wrong settings
// are refused on every rank before any communication. No timings are asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "comm_native/native_test_support.h"
#include "kolo/comm/benchmark.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace {

using testing::runThreads;

constexpr Collective kAll[] = {Collective::Allreduce, Collective::Reduce,  Collective::Broadcast,
                               Collective::Allgather, Collective::ReduceScatter, Collective::Alltoall,
                               Collective::Gather,    Collective::Scatter};

// Every rank's result of one call, in rank order.
std::vector<BenchmarkResult> measure(int ranks, const BenchmarkOptions& options, size_t bytes) {
  std::vector<BenchmarkResult> results(static_cast<size_t>(ranks));
  runThreads(ranks, [&](Communicator& comm) {
    results[static_cast<size_t>(comm.rank())] = benchmarkCollective(comm, options, bytes);
  });
  return results;
}

void expectSameOnEveryRank(const std::vector<BenchmarkResult>& results) {
  for (const BenchmarkResult& r : results) {
    EXPECT_EQ(r.bytes, results[0].bytes);
    EXPECT_EQ(r.count, results[0].count);
    EXPECT_EQ(r.correct, results[0].correct);
    EXPECT_EQ(r.medianUs, results[0].medianUs);  // each operation's time is the slowest rank's
    EXPECT_EQ(r.maxUs, results[0].maxUs);
  }
}

TEST(Benchmark, EveryCollectiveIsCorrectAtThreeRanks) {
  BenchmarkOptions options;
  options.warmup = 1;
  options.iters = 2;
  options.root = 2;
  for (Collective c : kAll) {
    options.collective = c;
    const auto results = measure(3, options, 4000);
    const bool split = c != Collective::Allreduce && c != Collective::Reduce && c != Collective::Broadcast;
    // 4000 bytes of f32: 1000 elements whole; 333 per rank (3996 bytes moved) when split.
    EXPECT_EQ(results[0].count, split ? 333u : 1000u) << collectiveName(c);
    EXPECT_EQ(results[0].bytes, split ? 3996u : 4000u) << collectiveName(c);
    EXPECT_TRUE(results[0].correct) << collectiveName(c);
    EXPECT_EQ(results[0].warmup, 1);
    EXPECT_EQ(results[0].iters, 2);
    EXPECT_LE(results[0].minUs, results[0].medianUs);
    EXPECT_LE(results[0].medianUs, results[0].maxUs);
    EXPECT_DOUBLE_EQ(results[0].busbw, results[0].algbw * busBandwidthFactor(c, 3));
    expectSameOnEveryRank(results);
  }
}

TEST(Benchmark, OtherDtypesOpsAndBufferLayoutsAtTwoRanks) {
  struct Case {
    Collective collective;
    DType dtype;
    ReduceOp op;
    bool inPlace;
    size_t bytes, count;
  };
  for (const Case& k : {
           Case{Collective::Allreduce, DType::BF16, ReduceOp::Avg, false, 1000, 500},
           Case{Collective::Allreduce, DType::F64, ReduceOp::Prod, true, 80, 10},
           Case{Collective::ReduceScatter, DType::I32, ReduceOp::Max, false, 1000, 125},
           Case{Collective::Alltoall, DType::U8, ReduceOp::Sum, true, 65537, 32768},
           Case{Collective::Gather, DType::F16, ReduceOp::Sum, false, 4096, 1024},
           Case{Collective::Scatter, DType::I64, ReduceOp::Sum, true, 4096, 256},
           Case{Collective::Broadcast, DType::F32, ReduceOp::Sum, false, 0, 0},  // the empty message
       }) {
    BenchmarkOptions options;
    options.collective = k.collective;
    options.dtype = k.dtype;
    options.op = k.op;
    options.inPlace = k.inPlace;
    options.root = 1;
    options.warmup = 0;
    options.iters = 1;
    const auto results = measure(2, options, k.bytes);
    const std::string what = std::string(collectiveName(k.collective)) + " " + dtypeName(k.dtype);
    EXPECT_EQ(results[0].count, k.count) << what;
    EXPECT_TRUE(results[0].correct) << what;
    expectSameOnEveryRank(results);
  }
}

TEST(Benchmark, AnchorScheduleSetsCountsBySize) {
  BenchmarkOptions options;
  options.anchorSchedule = true;
  options.iters = 0;  // not read under the anchor schedule
  const auto results = measure(2, options, 4096);
  EXPECT_EQ(results[0].warmup, 20);
  EXPECT_EQ(results[0].iters, 200);
  EXPECT_TRUE(results[0].correct);
}

// A sweep: rank 0 writes the header and one row per size (or a JSON line per size), the
// other ranks nothing; every result correct.
TEST(Benchmark, ASweepWritesRankZerosLines) {
  BenchmarkOptions options;
  options.warmup = 1;
  options.iters = 2;
  for (const bool json : {false, true}) {
    std::vector<std::string> written(2);
    std::vector<int> correct(2);
    runThreads(2, [&](Communicator& comm) {
      std::FILE* out = std::tmpfile();
      correct[static_cast<size_t>(comm.rank())] = benchmarkSweep(comm, options, {64, 4096, 1 << 16}, json, out);
      std::rewind(out);
      for (int c = std::fgetc(out); c != EOF; c = std::fgetc(out)) written[static_cast<size_t>(comm.rank())] += char(c);
      std::fclose(out);
    });
    EXPECT_EQ(correct, std::vector<int>({1, 1}));
    EXPECT_EQ(written[1], "") << "only rank 0 writes";
    const std::string& lines = written[0];
    EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), json ? 3 : 3 + 3) << lines;  // the header's three lines
    EXPECT_EQ(lines.rfind(json ? "{" : "# kolo bench allreduce", 0), 0u) << lines;
  }
}

// Runs a call that must be refused and returns rank 0's message (every rank refuses).
std::string refusal(int ranks, const BenchmarkOptions& options, size_t bytes) {
  std::mutex mutex;
  std::vector<std::string> messages;
  runThreads(ranks, [&](Communicator& comm) {
    try {
      benchmarkCollective(comm, options, bytes);
    } catch (const InvalidArgument& e) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(e.what());
    }
  });
  EXPECT_EQ(messages.size(), static_cast<size_t>(ranks)) << "not every rank refused";
  return messages.empty() ? "" : messages[0];
}

TEST(Benchmark, WrongSettingsAreRefusedNamingWhat) {
  BenchmarkOptions options;
  options.collective = Collective::Reduce;
  options.root = 2;
  std::string message = refusal(2, options, 4096);
  EXPECT_NE(message.find("root 2 is not one of the 2 ranks"), std::string::npos) << message;
  options.root = -1;
  message = refusal(2, options, 4096);
  EXPECT_NE(message.find("root -1"), std::string::npos) << message;

  options = {};
  message = refusal(2, options, 3);
  EXPECT_NE(message.find("size 3 bytes is below one f32 element"), std::string::npos) << message;
  options.collective = Collective::Allgather;
  options.dtype = DType::F64;
  message = refusal(2, options, 8);
  EXPECT_NE(message.find("below one f64 element per rank (16 bytes at 2 ranks)"), std::string::npos) << message;

  options = {};
  options.iters = 0;
  message = refusal(2, options, 4096);
  EXPECT_NE(message.find("iterations must be at least 1, got 0"), std::string::npos) << message;
  options = {};
  options.warmup = -1;
  message = refusal(2, options, 4096);
  EXPECT_NE(message.find("warm-up must be at least 0"), std::string::npos) << message;
}

}  // namespace
}  // namespace kolo::comm
