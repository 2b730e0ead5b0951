// Tests of `kolo bench`'s settings: byte sizes with suffixes, sweeps (also non-powers of
// two), size lists, collective names and the nccl-tests bus-bandwidth factors.
#include <gtest/gtest.h>

#include "cli/bench_options.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

TEST(BenchOptions, ParsesByteSizesWithBinarySuffixes) {
  EXPECT_EQ(parseByteSize("4096"), 4096u);
  EXPECT_EQ(parseByteSize("4K"), 4096u);
  EXPECT_EQ(parseByteSize("4k"), 4096u);
  EXPECT_EQ(parseByteSize("1M"), 1048576u);
  EXPECT_EQ(parseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(parseByteSize("2G"), size_t{2} << 30);
  EXPECT_EQ(parseByteSize("16KB"), 16384u);
  EXPECT_EQ(parseByteSize("0"), 0u);
  EXPECT_THROW(parseByteSize(""), InvalidArgument);
  EXPECT_THROW(parseByteSize("K"), InvalidArgument);
  EXPECT_THROW(parseByteSize("4X"), InvalidArgument);
  EXPECT_THROW(parseByteSize("99999999999999999999999"), InvalidArgument);
  EXPECT_THROW(parseByteSize("99999999999999G"), InvalidArgument);
}

TEST(BenchOptions, SweepsByFactorIncludingTheEnd) {
  EXPECT_EQ(sizeSweep(4096, 65536, 2, 0), (std::vector<size_t>{4096, 8192, 16384, 32768, 65536}));
  EXPECT_EQ(sizeSweep(1000, 1000000, 10, 0), (std::vector<size_t>{1000, 10000, 100000, 1000000}));
  EXPECT_EQ(sizeSweep(1000, 5000, 3, 0), (std::vector<size_t>{1000, 3000}));
  EXPECT_EQ(sizeSweep(7, 7, 2, 0), (std::vector<size_t>{7}));
}

TEST(BenchOptions, SweepsByStep) {
  EXPECT_EQ(sizeSweep(100, 400, 2, 150), (std::vector<size_t>{100, 250, 400}));
}

TEST(BenchOptions, RejectsEndlessOrEmptySweeps) {
  EXPECT_THROW(sizeSweep(10, 1, 2, 0), InvalidArgument);
  EXPECT_THROW(sizeSweep(10, 100, 1, 0), InvalidArgument);
  EXPECT_THROW(sizeSweep(0, 100, 2, 0), InvalidArgument);
}

TEST(BenchOptions, ParsesSizeLists) {
  EXPECT_EQ(parseSizeList("4K,1M,16M"), (std::vector<size_t>{4096, 1 << 20, 16 << 20}));
  EXPECT_EQ(parseSizeList("1000"), (std::vector<size_t>{1000}));
  EXPECT_THROW(parseSizeList(","), InvalidArgument);
}

TEST(BenchOptions, CollectiveNamesRoundTrip) {
  for (auto c : {BenchCollective::Allreduce, BenchCollective::Reduce, BenchCollective::Broadcast,
                 BenchCollective::Allgather, BenchCollective::ReduceScatter, BenchCollective::Alltoall,
                 BenchCollective::Gather, BenchCollective::Scatter}) {
    EXPECT_EQ(parseBenchCollective(benchCollectiveName(c)), c);
  }
  EXPECT_EQ(parseBenchCollective("reduce_scatter"), BenchCollective::ReduceScatter);
  EXPECT_THROW(parseBenchCollective("allreduc"), InvalidArgument);
}

TEST(BenchOptions, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Allreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Allreduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::ReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Allgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Alltoall, 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Reduce, 8), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(BenchCollective::Allreduce, 1), 0.0);
  EXPECT_TRUE(splitsAcrossRanks(BenchCollective::Allgather));
  EXPECT_FALSE(splitsAcrossRanks(BenchCollective::Allreduce));
}

}  // namespace
}  // namespace kolo::cli
