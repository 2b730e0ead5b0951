// The rendezvous' host table as runs (HostTable) and the peers a rank reads at rendezvous
// (algorithmPartners, likelyPeers): lookups against the table expanded rank by rank, and
// the partner sets symmetric, so that both ranks of a pair know where the other listens.
#include "comm/native/control_plane.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace kolo::comm::native {
namespace {

HostTable tableOf(const std::vector<uint32_t>& hostOf) {
  return HostTable(decodeHostRuns(encodeHostTable(hostOf), static_cast<int>(hostOf.size())));
}

TEST(HostTableTest, LookupsAgreeWithTheExpandedTable) {
  const std::vector<uint32_t> hostOf = {0, 0, 1, 1, 1, 0, 2, 2, 1};
  const HostTable table = tableOf(hostOf);
  EXPECT_EQ(table.size(), 9);
  EXPECT_EQ(table.hosts(), 3);
  EXPECT_EQ(table.expand(), hostOf);
  for (int r = 0; r < 9; ++r) EXPECT_EQ(table.hostOf(r), hostOf[static_cast<size_t>(r)]) << "rank " << r;
  EXPECT_EQ(table.ranksOf(0), (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(table.ranksOf(1), (std::vector<int>{2, 3, 4, 8}));
  EXPECT_EQ(table.countOf(2), 2);
  EXPECT_EQ(table.rankOf(1, 3), 8);
  EXPECT_EQ(table.rankOf(2, 2), -1);
  EXPECT_FALSE(table.evenHosts());
  EXPECT_TRUE(tableOf({0, 0, 1, 1, 2, 2}).evenHosts());
}

bool contains(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

TEST(LikelyPeersTest, PartnersAreMutualAndFew) {
  for (int n : {2, 3, 5, 8, 9, 100, 1000}) {
    for (int r = 0; r < n; ++r) {
      const std::vector<int> mine = algorithmPartners(r, n);
      EXPECT_FALSE(contains(mine, r));
      EXPECT_TRUE(contains(mine, (r + 1) % n) || n == 1);
      for (int q : mine) EXPECT_TRUE(contains(algorithmPartners(q, n), r)) << r << " and " << q << " of " << n;
    }
  }
  int log2 = 0;
  while ((1 << log2) < 16384) ++log2;
  EXPECT_LE(algorithmPartners(12345, 16384).size(), static_cast<size_t>(4 * log2 + 4));
}

TEST(LikelyPeersTest, SharedMemoryPeersAreLeftOutAndRankZeroTakesEveryone) {
  std::vector<uint32_t> hostOf;
  for (uint32_t h = 0; h < 4; ++h) hostOf.insert(hostOf.end(), 4, h);  // 4 hosts of 4
  const HostTable table = tableOf(hostOf);
  for (int r = 1; r < 16; ++r) {
    const std::vector<int> peers = likelyPeers(r, table, true);
    for (int q : peers) EXPECT_NE(table.hostOf(q), table.hostOf(r)) << "rank " << r << " reads local " << q;
    EXPECT_TRUE(contains(peers, 0) || table.hostOf(r) == 0);
    for (int q : peers) EXPECT_TRUE(contains(likelyPeers(q, table, true), r) || q == 0) << r << " and " << q;
  }
  EXPECT_EQ(likelyPeers(0, table, false).size(), 15u);
  EXPECT_EQ(likelyPeers(0, table, true).size(), 12u);
}

}  // namespace
}  // namespace kolo::comm::native
