// The benchmark's helpers that need no communicator: sweeps (also non-powers of two), size
// lists, collective names and the nccl-tests bus-bandwidth factors.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kolo::comm
