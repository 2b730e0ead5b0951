// The hierarchical all-reduce over simulated hosts, and every other collective (reduce,
// broadcast, all-gather(v), reduce-scatter, gather, scatter, all-to-all, barrier) over
// thread ranks, with world sizes 1..8, several roots, zero and uneven sizes, in place and
// out of place, buffered and rendezvous sends.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
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

AlgorithmOptions tinyChunks() {
  AlgorithmOptions opts;
  opts.chunkBytes = 24;
  opts.window = 2;
  opts.recursiveDoublingBytes = 16;
  opts.chainBroadcastBytes = 64;
  return opts;
}

// Byte i that `rank` sends towards `block` in the data-movement collectives: the
// closed-form code, which fits a byte and is never 0.
unsigned char pattern(int rank, int block, size_t i) {
  return static_cast<unsigned char>(closedFormCode(rank, block, i));
}

// ---------------------------------------------------------------- hierarchical

struct HierCase {
  std::vector<int> hostSizes;
  int localRoot;
  Algorithm leaderAlgorithm;
  size_t count;
  DType dtype;
  ReduceOp op;
  bool inPlace;
  AlgorithmOptions opts;
};

void runHierarchical(const HierCase& c) {
  const int hosts = static_cast<int>(c.hostSizes.size());
  const int world = std::accumulate(c.hostSizes.begin(), c.hostSizes.end(), 0);
  std::vector<int> hostOf, localRank;
  for (int h = 0; h < hosts; ++h)
    for (int l = 0; l < c.hostSizes[h]; ++l) {
      hostOf.push_back(h);
      localRank.push_back(l);
    }
  std::vector<std::unique_ptr<Fabric>> local;
  std::vector<Fabric*> all;
  for (int h = 0; h < hosts; ++h) {
    local.push_back(std::make_unique<Fabric>(c.hostSizes[h], SendMode::Rendezvous));
    all.push_back(local.back().get());
  }
  Fabric leaders(hosts, SendMode::Buffered);
  all.push_back(&leaders);
  const std::vector<char> want = testing::expectedResult(c.dtype, c.count, world, c.op);
  testing::runThreads(world, all, [&](int r) {
    auto localLinks = local[hostOf[r]]->links(localRank[r]);
    std::unique_ptr<Links> leaderLinks;
    if (localRank[r] == c.localRoot) leaderLinks = leaders.links(hostOf[r]);
    HierarchicalGroups groups{localLinks.get(), leaderLinks.get(), c.localRoot, world, c.leaderAlgorithm};
    std::vector<char> input = testing::makeInput(c.dtype, c.count, r, world, c.op);
    std::vector<char> output(input.size());
    void* dst = c.inPlace ? input.data() : output.data();
    allreduce(*localLinks, input.data(), dst, c.count, c.dtype, c.op, Algorithm::Hierarchical, c.opts, &groups);
    const std::string diff = testing::firstDifference(c.dtype, dst, want.data(), c.count);
    if (!diff.empty()) KOLO_THROW(Error, "rank ", r, ": ", diff);
  });
}

TEST(Hierarchical, SimulatedHostsGiveTheFlatResult) {
  const std::vector<std::vector<int>> layouts = {{2, 2}, {3, 2}, {2, 3}, {3, 1}, {1, 1, 1}, {2, 2, 2, 2}, {4}};
  for (const auto& layout : layouts)
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (bool inPlace : {false, true}) {
          HierCase c{layout, 0, Algorithm::Auto, count, DType::F32, op, inPlace, tinyChunks()};
          SCOPED_TRACE(::testing::Message() << "hosts " << layout.size() << " first " << layout[0] << " count "
                                            << count << " " << reduceOpName(op) << (inPlace ? " in place" : ""));
          EXPECT_NO_THROW(runHierarchical(c));
        }
}

TEST(Hierarchical, EveryLeaderAlgorithmDtypeAndRoot) {
  for (Algorithm leaderAlgo :
       {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::ReduceBroadcast})
    for (DType dtype : {DType::F64, DType::BF16, DType::I64, DType::U8})
      for (int localRoot : {0, 1}) {
        HierCase c{{2, 3, 2}, localRoot, leaderAlgo, 29, dtype, ReduceOp::Avg, localRoot == 1, tinyChunks()};
        SCOPED_TRACE(::testing::Message() << algorithmName(leaderAlgo) << " " << dtypeName(dtype) << " root "
                                          << localRoot);
        EXPECT_NO_THROW(runHierarchical(c));
      }
  HierCase large{{2, 2}, 0, Algorithm::Auto, 1000003, DType::F32, ReduceOp::Sum, false, {}};
  EXPECT_NO_THROW(runHierarchical(large));
}

TEST(Hierarchical, InconsistentGroupsAreRejected) {
  Fabric f(1, SendMode::Buffered);
  auto links = f.links(0);
  float x = 1;
  HierarchicalGroups noLeaders{links.get(), nullptr, 0, 1};
  EXPECT_THROW(hierarchicalAllreduce(noLeaders, &x, &x, 1, DType::F32, ReduceOp::Sum), InvalidArgument);
  HierarchicalGroups badRoot{links.get(), links.get(), 3, 1};
  EXPECT_THROW(hierarchicalAllreduce(badRoot, &x, &x, 1, DType::F32, ReduceOp::Sum), InvalidArgument);
  HierarchicalGroups ok{links.get(), links.get(), 0, 1};
  EXPECT_NO_THROW(hierarchicalAllreduce(ok, &x, &x, 1, DType::F32, ReduceOp::Sum));
  EXPECT_EQ(x, 1.0f);
}

// ---------------------------------------------------------------- reduce / broadcast

TEST(Reduce, BinomialTreeEveryRootSizeAndCount) {
  for (int n = 1; n <= 8; ++n)
    for (int root : {0, n - 1, n / 2})
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{61}})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg})
          for (bool inPlace : {false, true}) {
            const DType dtype = op == ReduceOp::Avg ? DType::F32 : DType::I64;
            const std::vector<char> want = testing::expectedResult(dtype, count, n, op);
            SCOPED_TRACE(::testing::Message() << "n=" << n << " root " << root << " count " << count << " "
                                              << reduceOpName(op) << (inPlace ? " in place" : ""));
            EXPECT_NO_THROW(testing::runRanks(n, inPlace ? SendMode::Rendezvous : SendMode::Buffered,
                                              [&](Links& links, int r) {
              std::vector<char> input = testing::makeInput(dtype, count, r, n, op);
              std::vector<char> output(input.size());
              void* dst = r != root ? nullptr : inPlace ? input.data() : output.data();
              reduce(links, input.data(), dst, count, dtype, op, root, tinyChunks());
              if (r == root) {
                const std::string diff = testing::firstDifference(dtype, dst, want.data(), count);
                if (!diff.empty()) KOLO_THROW(Error, "root ", r, ": ", diff);
              }
            }));
          }
}

TEST(Broadcast, TreeChainAndAutoFromEveryRoot) {
  using BroadcastFn = void (*)(Links&, void*, size_t, int, const AlgorithmOptions&);
  const BroadcastFn fns[] = {&treeBroadcast, &chainBroadcast, &broadcast};
  for (BroadcastFn fn : fns)
    for (int n = 1; n <= 8; ++n)
      for (int root = 0; root < n; root += 3)
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}})
          for (SendMode mode : {SendMode::Buffered, SendMode::Rendezvous}) {
            SCOPED_TRACE(::testing::Message() << "fn " << (fn == fns[0] ? "tree" : fn == fns[1] ? "chain" : "auto")
                                              << " n=" << n << " root " << root << " bytes " << bytes);
            EXPECT_NO_THROW(testing::runRanks(n, mode, [&](Links& links, int r) {
              std::vector<unsigned char> buf(bytes + 1, 0xee);
              if (r == root)
                for (size_t i = 0; i < bytes; ++i) buf[i] = pattern(root, 0, i);
              fn(links, buf.data(), bytes, root, tinyChunks());
              for (size_t i = 0; i < bytes; ++i)
                if (buf[i] != pattern(root, 0, i)) KOLO_THROW(Error, "rank ", r, " byte ", i, " wrong");
              if (buf[bytes] != 0xee) KOLO_THROW(Error, "rank ", r, " wrote past the end");
            }));
          }
}

TEST(Broadcast, BadRootIsRejected) {
  Fabric f(1, SendMode::Buffered);
  auto links = f.links(0);
  char x = 0;
  EXPECT_THROW(treeBroadcast(*links, &x, 1, 1), InvalidArgument);
  EXPECT_THROW(reduce(*links, &x, &x, 1, DType::U8, ReduceOp::Sum, -1), InvalidArgument);
}

// ---------------------------------------------------------------- gathers and scatters

TEST(Allgather, RingEqualAndVariableBlocksAnyPlacement) {
  for (int n = 1; n <= 8; ++n)
    for (int variant = 0; variant < 4; ++variant)
      for (size_t unit : {size_t{0}, size_t{1}, size_t{7}, size_t{100}}) {
        // variant 0: equal blocks, separate send buffer; 1: equal, send already at own
        // block (in place); 2: equal, send at the start of recvbuf; 3: allgatherv with
        // uneven sizes including empty blocks.
        std::vector<size_t> sizes(n, unit);
        if (variant == 3)
          for (int r = 0; r < n; ++r) sizes[r] = unit * static_cast<size_t>((r * 3) % 5) / 2;
        const std::vector<size_t> offs = [&] {
          std::vector<size_t> o(n, 0);
          for (int r = 1; r < n; ++r) o[r] = o[r - 1] + sizes[r - 1];
          return o;
        }();
        const size_t total = offs[n - 1] + sizes[n - 1];
        SCOPED_TRACE(::testing::Message() << "n=" << n << " variant " << variant << " unit " << unit);
        EXPECT_NO_THROW(testing::runRanks(n, variant % 2 ? SendMode::Rendezvous : SendMode::Buffered,
                                          [&](Links& links, int r) {
          std::vector<unsigned char> recv(total + 1, 0xee);
          std::vector<unsigned char> mine(sizes[r] + 1);
          for (size_t i = 0; i < sizes[r]; ++i) mine[i] = pattern(r, 0, i);
          const void* send = mine.data();
          if (variant == 1 || variant == 2) {
            unsigned char* at = recv.data() + (variant == 1 ? offs[r] : 0);
            std::memcpy(at, mine.data(), sizes[r]);
            send = at;
          }
          if (variant == 3) {
            ringAllgatherv(links, send, recv.data(), sizes, tinyChunks());
          } else {
            ringAllgather(links, send, recv.data(), unit, tinyChunks());
          }
          for (int b = 0; b < n; ++b)
            for (size_t i = 0; i < sizes[b]; ++i)
              if (recv[offs[b] + i] != pattern(b, 0, i)) KOLO_THROW(Error, "rank ", r, " block ", b, " byte ", i);
          if (recv[total] != 0xee) KOLO_THROW(Error, "rank ", r, " wrote past the end");
        }));
      }
}

TEST(ReduceScatter, RingEqualAndUnevenBlocks) {
  for (int n = 1; n <= 8; ++n)
    for (int variant = 0; variant < 3; ++variant)
      for (size_t unit : {size_t{0}, size_t{1}, size_t{7}})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min})
          for (bool inPlace : {false, true}) {
            // variant 0: equal blocks; 1: uneven with empties; 2: equal, default chunks.
            std::vector<size_t> counts(n, unit);
            if (variant == 1)
              for (int r = 0; r < n; ++r) counts[r] = (unit * (r * 2 + 1)) % 4 + (r % 3 == 0 ? 0 : unit);
            const Blocks blocks = blocksFromLengths(counts);
            const DType dtype = op == ReduceOp::Sum ? DType::I32 : DType::F32;
            const size_t esize = dtypeSize(dtype);
            const std::vector<char> want = testing::expectedResult(dtype, blocks.total, n, op);
            SCOPED_TRACE(::testing::Message() << "n=" << n << " variant " << variant << " unit " << unit << " "
                                              << reduceOpName(op) << (inPlace ? " in place" : ""));
            EXPECT_NO_THROW(testing::runRanks(n, inPlace ? SendMode::Buffered : SendMode::Rendezvous,
                                              [&](Links& links, int r) {
              std::vector<char> input = testing::makeInput(dtype, blocks.total, r, n, op);
              std::vector<char> output(counts[r] * esize + 1);
              void* dst = inPlace ? input.data() : output.data();
              const AlgorithmOptions opts = variant == 2 ? AlgorithmOptions{} : tinyChunks();
              if (variant == 1) {
                ringReduceScatter(links, input.data(), dst, counts, dtype, op, opts);
              } else {
                reduceScatter(links, input.data(), dst, unit, dtype, op, opts);
              }
              const std::string diff =
                  testing::firstDifference(dtype, dst, want.data() + blocks.offset[r] * esize, counts[r]);
              if (!diff.empty()) KOLO_THROW(Error, "rank ", r, ": ", diff);
            }));
          }
}

TEST(GatherScatter, EveryRootAndSize) {
  for (int n = 1; n <= 8; ++n)
    for (int root = 0; root < n; root += 2)
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{300}})
        for (bool inPlace : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " root " << root << " bytes " << bytes
                                            << (inPlace ? " in place" : ""));
          EXPECT_NO_THROW(testing::runRanks(n, inPlace ? SendMode::Rendezvous : SendMode::Buffered,
                                            [&](Links& links, int r) {
            // gather: rank r contributes pattern(r, 0, i); root sees every block.
            std::vector<unsigned char> all(n * bytes + 1, 0xee);
            std::vector<unsigned char> mine(bytes + 1);
            for (size_t i = 0; i < bytes; ++i) mine[i] = pattern(r, 0, i);
            const void* send = mine.data();
            if (inPlace && r == root) {
              std::memcpy(all.data() + r * bytes, mine.data(), bytes);
              send = all.data() + r * bytes;
            }
            gather(links, send, r == root ? all.data() : nullptr, bytes, root);
            if (r == root)
              for (int b = 0; b < n; ++b)
                for (size_t i = 0; i < bytes; ++i)
                  if (all[b * bytes + i] != pattern(b, 0, i)) KOLO_THROW(Error, "gather block ", b, " byte ", i);
            // scatter: root sends pattern(root, b, i) to rank b.
            std::vector<unsigned char> blocks(n * bytes + 1);
            if (r == root)
              for (int b = 0; b < n; ++b)
                for (size_t i = 0; i < bytes; ++i) blocks[b * bytes + i] = pattern(root, b, i);
            std::vector<unsigned char> got(bytes + 1, 0xee);
            void* recv = (inPlace && r == root) ? blocks.data() + r * bytes : got.data();
            scatter(links, r == root ? blocks.data() : nullptr, recv, bytes, root);
            const unsigned char* g = static_cast<const unsigned char*>(recv);
            for (size_t i = 0; i < bytes; ++i)
              if (g[i] != pattern(root, r, i)) KOLO_THROW(Error, "scatter rank ", r, " byte ", i);
          }));
        }
}

TEST(Alltoall, PairwiseAndInPlace) {
  for (int n = 1; n <= 8; ++n)
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{100}})
      for (bool inPlace : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " bytes " << bytes << (inPlace ? " in place" : ""));
        EXPECT_NO_THROW(testing::runRanks(n, inPlace ? SendMode::Rendezvous : SendMode::Buffered,
                                          [&](Links& links, int r) {
          std::vector<unsigned char> send(n * bytes + 1), recv(n * bytes + 1, 0xee);
          for (int b = 0; b < n; ++b)
            for (size_t i = 0; i < bytes; ++i) send[b * bytes + i] = pattern(r, b, i);
          unsigned char* dst = inPlace ? send.data() : recv.data();
          alltoall(links, send.data(), dst, bytes, tinyChunks());
          for (int b = 0; b < n; ++b)
            for (size_t i = 0; i < bytes; ++i)
              if (dst[b * bytes + i] != pattern(b, r, i)) KOLO_THROW(Error, "rank ", r, " block ", b, " byte ", i);
        }));
      }
}

TEST(Barrier, NoRankLeavesBeforeAllArrive) {
  for (int n = 1; n <= 8; ++n) {
    std::atomic<int> arrived[3] = {0, 0, 0};
    EXPECT_NO_THROW(testing::runRanks(n, SendMode::Rendezvous, [&](Links& links, int r) {
      for (int round = 0; round < 3; ++round) {
        // Late arrivals make a broken barrier let someone through early.
        std::this_thread::sleep_for(std::chrono::microseconds(200 * ((r + round) % n)));
        arrived[round].fetch_add(1);
        disseminationBarrier(links);
        if (arrived[round].load() != n)
          KOLO_THROW(Error, "rank ", r, " left barrier ", round, " with ", arrived[round].load(), " of ", n, " arrived");
      }
    })) << "n=" << n;
  }
}

}  // namespace
}  // namespace kolo::comm::detail
