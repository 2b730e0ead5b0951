// Every all-reduce algorithm over thread ranks: world sizes 1..8, counts 0, 1, 7, uneven
// chunked counts and the prime 1000003, in place and out of place, buffered and
// rendezvous sends, every dtype and op, against closed-form results.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/closed_form.h"
#include "comm_algorithms/thread_links.h"
#include "comm_algorithms/values.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

using testing::Fabric;
using testing::SendMode;

const Algorithm kFlat[] = {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::ReduceBroadcast};

// Tiny chunks and thresholds so that small counts already take the pipelined, chunked and
// halving paths; default options are used for the large counts.
AlgorithmOptions tinyChunks() {
  AlgorithmOptions opts;
  opts.chunkBytes = 24;
  opts.window = 3;
  opts.recursiveDoublingBytes = 16;
  opts.chainBroadcastBytes = 64;
  return opts;
}

struct Case {
  Algorithm algo;
  int n;
  size_t count;
  DType dtype;
  ReduceOp op;
  bool inPlace;
  SendMode mode;
  AlgorithmOptions opts;
};

std::string describe(const Case& c) {
  return std::string(algorithmName(c.algo)) + " n=" + std::to_string(c.n) + " count=" + std::to_string(c.count) + " " +
         dtypeName(c.dtype) + " " + reduceOpName(c.op) + (c.inPlace ? " in-place" : " out-of-place") +
         (c.mode == SendMode::Rendezvous ? " rendezvous" : " buffered") +
         " chunk=" + std::to_string(c.opts.chunkBytes);
}

void runCase(const Case& c) {
  SCOPED_TRACE(describe(c));
  const std::vector<char> want = testing::expectedResult(c.dtype, c.count, c.n, c.op);
  const size_t bytes = c.count * dtypeSize(c.dtype);
  testing::runRanks(c.n, c.mode, [&](Links& links, int r) {
    std::vector<char> input = testing::makeInput(c.dtype, c.count, r, c.n, c.op);
    const std::vector<char> original = input;
    std::vector<char> output(input.size(), 0x5a);
    void* dst = c.inPlace ? input.data() : output.data();
    allreduce(links, input.data(), dst, c.count, c.dtype, c.op, c.algo, c.opts);
    const std::string diff = testing::firstDifference(c.dtype, dst, want.data(), c.count);
    if (!diff.empty()) KOLO_THROW(Error, "rank ", r, ": ", diff);
    if (!c.inPlace && std::memcmp(input.data(), original.data(), bytes) != 0)
      KOLO_THROW(Error, "rank ", r, ": the send buffer was modified");
  });
}

void expectCase(const Case& c) {
  try {
    runCase(c);
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(c) << ": " << e.what();
  }
}

TEST(Allreduce, EveryAlgorithmSizeCountAndPlacement) {
  for (Algorithm algo : kFlat)
    for (int n = 1; n <= 8; ++n)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{61}})
        for (bool inPlace : {false, true}) {
          expectCase({algo, n, count, DType::F32, ReduceOp::Sum, inPlace, SendMode::Buffered, {}});
          expectCase({algo, n, count, DType::I32, ReduceOp::Max, inPlace, SendMode::Rendezvous, tinyChunks()});
        }
}

TEST(Allreduce, RingEveryDtypeAndOp) {
  for (DType dtype : kAllDTypes)
    for (ReduceOp op : kAllReduceOps)
      for (int n = 1; n <= 8; ++n)
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}})
          for (bool inPlace : {false, true})
            expectCase({Algorithm::Ring, n, count, dtype, op, inPlace, inPlace ? SendMode::Rendezvous : SendMode::Buffered,
                        count == 7 ? tinyChunks() : AlgorithmOptions{}});
}

TEST(Allreduce, OtherAlgorithmsEveryDtypeAndOp) {
  for (Algorithm algo : {Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::ReduceBroadcast})
    for (DType dtype : kAllDTypes)
      for (ReduceOp op : kAllReduceOps)
        for (int n : {2, 3, 5, 8})
          for (bool inPlace : {false, true})
            expectCase({algo, n, 29, dtype, op, inPlace, inPlace ? SendMode::Buffered : SendMode::Rendezvous, tinyChunks()});
}

TEST(Allreduce, PrimeCountAboveOneMillion) {
  const size_t prime = 1000003;
  expectCase({Algorithm::Ring, 2, prime, DType::F32, ReduceOp::Sum, false, SendMode::Buffered, {}});
  expectCase({Algorithm::Ring, 3, prime, DType::F32, ReduceOp::Avg, true, SendMode::Rendezvous, {}});
  expectCase({Algorithm::Ring, 8, prime, DType::BF16, ReduceOp::Sum, true, SendMode::Buffered, {}});
  expectCase({Algorithm::HalvingDoubling, 4, prime, DType::F32, ReduceOp::Sum, false, SendMode::Rendezvous, {}});
  expectCase({Algorithm::HalvingDoubling, 7, prime, DType::F64, ReduceOp::Max, true, SendMode::Buffered, {}});
  expectCase({Algorithm::Tree, 5, prime, DType::I32, ReduceOp::Sum, false, SendMode::Buffered, {}});
  expectCase({Algorithm::ReduceBroadcast, 3, prime, DType::F16, ReduceOp::Min, true, SendMode::Rendezvous, {}});
}

TEST(Allreduce, AutoChoosesByTheDocumentedTable) {
  EXPECT_EQ(chooseAllreduceAlgorithm(1 << 20, 1, 1), Algorithm::Ring);
  EXPECT_EQ(chooseAllreduceAlgorithm(4096, 8, 1), Algorithm::HalvingDoubling);
  EXPECT_EQ(chooseAllreduceAlgorithm(kLatencyBytes, 8, 1), Algorithm::HalvingDoubling);
  EXPECT_EQ(chooseAllreduceAlgorithm(kLatencyBytes + 1, 8, 1), Algorithm::Ring);
  EXPECT_EQ(chooseAllreduceAlgorithm(64 << 20, 2, 1), Algorithm::HalvingDoubling);
  EXPECT_EQ(chooseAllreduceAlgorithm(64 << 20, 4, 2), Algorithm::Hierarchical);
  EXPECT_EQ(chooseAllreduceAlgorithm(4096, 4, 2), Algorithm::Hierarchical);
  EXPECT_EQ(chooseAllreduceAlgorithm(64 << 20, 4, 4), Algorithm::Ring);  // one rank per host
  expectCase({Algorithm::Auto, 6, 1000, DType::F32, ReduceOp::Sum, false, SendMode::Buffered, {}});
  expectCase({Algorithm::Auto, 6, 100000, DType::F32, ReduceOp::Sum, true, SendMode::Buffered, {}});
}

TEST(Allreduce, HierarchicalWithoutGroupsIsRejected) {
  EXPECT_THROW(
      testing::runRanks(1, SendMode::Buffered,
                        [](Links& links, int) {
                          float x = 1;
                          allreduce(links, &x, &x, 1, DType::F32, ReduceOp::Sum, Algorithm::Hierarchical);
                        }),
      InvalidArgument);
}

TEST(Allreduce, ResultsAreBitIdenticalAcrossRanksForRoundedSums) {
  // Non-integer data: the sum depends on the order of additions, yet every rank must get
  // the same bits as every other (each algorithm computes each element in one place or in
  // a rank-symmetric order).
  for (Algorithm algo : kFlat)
    for (int n : {3, 4, 6}) {
      const size_t count = 97;
      std::vector<std::vector<float>> results(n);
      testing::runRanks(n, SendMode::Buffered, [&](Links& links, int r) {
        std::vector<float> x(count);
        for (size_t i = 0; i < count; ++i) x[i] = 1.0f / static_cast<float>(3 + r + i);
        results[r].resize(count);
        allreduce(links, x.data(), results[r].data(), count, DType::F32, ReduceOp::Sum, algo, tinyChunks());
      });
      for (int r = 1; r < n; ++r)
        EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), count * 4), 0)
            << algorithmName(algo) << " n=" << n << " rank " << r;
    }
}

TEST(Allreduce, TransportErrorsReachTheCaller) {
  // One rank disagrees about the count: the double's length check throws Mismatch inside
  // the algorithm, which must surface instead of hanging or being swallowed.
  for (Algorithm algo : kFlat) {
    EXPECT_THROW(testing::runRanks(4, SendMode::Buffered,
                                   [&](Links& links, int r) {
                                     std::vector<float> x(9, 1.0f);
                                     const size_t count = r == 2 ? 9 : 7;
                                     allreduce(links, x.data(), x.data(), count, DType::F32, ReduceOp::Sum, algo);
                                   }),
                 Mismatch)
        << algorithmName(algo);
  }
}

TEST(AlgorithmNames, ParseRoundTrips) {
  for (Algorithm a : {Algorithm::Auto, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree,
                      Algorithm::ReduceBroadcast, Algorithm::Hierarchical})
    EXPECT_EQ(parseAlgorithm(algorithmName(a)), a);
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(parseReduceOp(reduceOpName(op)), op);
  EXPECT_THROW(parseAlgorithm("butterfly"), InvalidArgument);
  EXPECT_THROW(parseReduceOp("xor"), InvalidArgument);
}

}  // namespace
}  // namespace kolo::comm::detail
