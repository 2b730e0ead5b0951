// The benchmark's helpers that need no communicator: sweeps (also non-powers of two), size
// lists, collective names, the nccl-tests bus-bandwidth factors, and the table and JSON lines.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "kolo/comm/benchmark.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace {

TEST(BenchmarkOptions, SweepsByFactorIncludingTheEnd) {
  EXPECT_EQ(sizeSweep(4096, 65536, 2, 0), (std::vector<size_t>{4096, 8192, 16384, 32768, 65536}));
  EXPECT_EQ(sizeSweep(1000, 1000000, 10, 0), (std::vector<size_t>{1000, 10000, 100000, 1000000}));
  EXPECT_EQ(sizeSweep(1000, 5000, 3, 0), (std::vector<size_t>{1000, 3000}));
  EXPECT_EQ(sizeSweep(7, 7, 2, 0), (std::vector<size_t>{7}));
}

TEST(BenchmarkOptions, SweepsByStep) {
  EXPECT_EQ(sizeSweep(100, 400, 2, 150), (std::vector<size_t>{100, 250, 400}));
}

TEST(BenchmarkOptions, RejectsEndlessOrEmptySweeps) {
  EXPECT_THROW(sizeSweep(10, 1, 2, 0), InvalidArgument);
  EXPECT_THROW(sizeSweep(10, 100, 1, 0), InvalidArgument);
  EXPECT_THROW(sizeSweep(0, 100, 2, 0), InvalidArgument);
}

TEST(BenchmarkOptions, ParsesSizeLists) {
  EXPECT_EQ(parseSizeList("4K,1M,16M"), (std::vector<size_t>{4096, 1 << 20, 16 << 20}));
  EXPECT_EQ(parseSizeList("1000"), (std::vector<size_t>{1000}));
  EXPECT_THROW(parseSizeList(","), InvalidArgument);
}

TEST(BenchmarkOptions, CollectiveNamesRoundTrip) {
  for (auto c : {Collective::Allreduce, Collective::Reduce, Collective::Broadcast,
                 Collective::Allgather, Collective::ReduceScatter, Collective::Alltoall,
                 Collective::Gather, Collective::Scatter}) {
    EXPECT_EQ(parseCollective(collectiveName(c)), c);
  }
  EXPECT_EQ(parseCollective("reduce_scatter"), Collective::ReduceScatter);
  EXPECT_THROW(parseCollective("allreduc"), InvalidArgument);
}

TEST(BenchmarkOptions, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Allreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Allreduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::ReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Allgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Alltoall, 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Reduce, 8), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::Allreduce, 1), 0.0);
  EXPECT_TRUE(splitsAcrossRanks(Collective::Allgather));
  EXPECT_FALSE(splitsAcrossRanks(Collective::Allreduce));
}

const BenchmarkResult kResult{.bytes = 4096, .count = 1024, .warmup = 5, .iters = 20, .medianUs = 12.3456,
                              .minUs = 10.0004, .p10Us = 11.0, .p90Us = 15.5, .maxUs = 20.25,
                              .algbw = 0.331776, .busbw = 0.497664, .correct = true};

TEST(BenchmarkLines, TheTableNamesTheMeasurementAndEachRowItsFigures) {
  const BenchmarkOptions options{.collective = Collective::Reduce, .dtype = DType::BF16, .op = ReduceOp::Max,
                                 .root = 1, .inPlace = false, .warmup = 2, .iters = 7};
  const std::string header = benchmarkTableHeader(options, 4, "native");
  EXPECT_EQ(header.substr(0, header.find('\n')),
            "# kolo bench reduce: np 4, backend native, algo auto, dtype bf16, op max, root 1, out of place, "
            "warmup 2, iters 7");
  EXPECT_NE(benchmarkTableHeader({.anchorSchedule = true}, 2, "mpi").find("in place, anchor schedule\n"),
            std::string::npos);
  std::istringstream columns(header.substr(header.rfind('\n') + 1));
  std::vector<std::string> names{std::istream_iterator<std::string>(columns), {}};
  EXPECT_EQ(names, (std::vector<std::string>{"bytes", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "correct"}));
  std::istringstream row(benchmarkTableRow(kResult));
  std::vector<std::string> cells{std::istream_iterator<std::string>(row), {}};
  EXPECT_EQ(cells, (std::vector<std::string>{"4096", "1024", "12.35", "0.3318", "0.4977", "yes"}));
  BenchmarkResult wrong = kResult;
  wrong.correct = false;
  EXPECT_EQ(benchmarkTableRow(wrong).substr(benchmarkTableRow(wrong).size() - 2), "NO");
}

TEST(BenchmarkLines, AJsonLineHoldsEveryFieldRounded) {
  const std::string text = benchmarkJson({.collective = Collective::Allgather}, 3, "native", kResult);
  EXPECT_EQ(text.find('\n'), std::string::npos);
  const nlohmann::ordered_json line = nlohmann::ordered_json::parse(text);
  EXPECT_EQ(line["bench"], "kolo_allgather");
  EXPECT_EQ(line["impl"], "kolo-native");
  EXPECT_EQ(line["np"], 3);
  EXPECT_EQ(line["dtype"], "f32");
  EXPECT_EQ(line["inplace"], true);
  EXPECT_EQ(line["bytes"], 4096);
  EXPECT_EQ(line["iters"], 20);
  EXPECT_DOUBLE_EQ(line["t_median_us"].get<double>(), 12.346);
  EXPECT_DOUBLE_EQ(line["t_min_us"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(line["busbw_GBps"].get<double>(), 0.4977);
  EXPECT_EQ(line["correct"], true);
  EXPECT_EQ(line["slow_calls"], 0);
  EXPECT_EQ(line["last_slow_call"], -1);
  EXPECT_FALSE(line.contains("waits_slept"));  // not measured (-1): left out
  std::vector<std::string> keys;
  for (const auto& item : line.items()) keys.push_back(item.key());
  EXPECT_EQ(keys.size(), 24u);
  EXPECT_EQ(keys.front(), "bench");
  EXPECT_EQ(keys.back(), "correct");
}

}  // namespace
}  // namespace kolo::comm
