// `kolo bench rendezvous`'s library function at a small size: 64 simulated ranks on 4 hosts,
// through host stores and straight to the root, with a regroup after 10 % are lost. Every
// rank must read both ring neighbours' records as they published them (in both generations),
// the JSON line must carry its fields, and host stores must leave the root a few
// connections per host; the eager communicator's full address book is what makes the root
// send more bytes. No timing is checked.
#include "launch/rendezvous_benchmark.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kolo::launch {
namespace {

using namespace std::chrono_literals;

RendezvousBenchmarkOptions smallJob(bool hostStores) {
  RendezvousBenchmarkOptions options;
  options.ranks = 64;
  options.hosts = 4;
  options.dropPercent = 10;
  options.hostStores = hostStores;
  options.timeout = 60s;
  return options;
}

TEST(RendezvousBenchmarkTest, EveryRankReadsBothNeighboursThroughHostStores) {
  const RendezvousBenchmarkResult result = benchmarkRendezvous(smallJob(true));
  const int lost = 64 * 10 / 100;
  EXPECT_EQ(result.lost, lost);
  EXPECT_EQ(result.hostStores, 4);
  // Two neighbours per rank in generation 0, two per survivor in generation 1.
  EXPECT_EQ(result.neighboursChecked, 2 * 64 + 2 * (64 - lost));
  // Per host store: its batches, its watcher, a barrier connection; and the connection
  // that marks the lost ranks. At most a few per host, not one per rank.
  EXPECT_LE(result.storeConnections, uint64_t{4 * 4 + 1});

  const auto line = nlohmann::json::parse(rendezvousBenchmarkJson(result));
  for (const char* field :
       {"ranks", "hosts", "host_stores", "processes", "lost", "rendezvous_s", "barrier_s", "step_s",
        "regroup_s", "neighbours_checked", "store_peak_bytes", "store_requests",
        "store_connections", "store_bytes_received", "store_bytes_sent", "file_limit"})
    EXPECT_TRUE(line.contains(field)) << field << " missing from " << line.dump();
  EXPECT_EQ(line["ranks"], 64);
  EXPECT_EQ(line["hosts"], 4);
  EXPECT_GT(line["rendezvous_s"].get<double>(), 0);
  EXPECT_GT(line["regroup_s"].get<double>(), 0);
}

TEST(RendezvousBenchmarkTest, RanksAtTheRootGiveItAConnectionEach) {
  const RendezvousBenchmarkResult result = benchmarkRendezvous(smallJob(false));
  EXPECT_EQ(result.hostStores, 0);
  EXPECT_EQ(result.neighboursChecked, 2 * 64 + 2 * (64 - result.lost));
  EXPECT_GE(result.storeConnections, uint64_t{64});
  // The same pattern through host stores reaches the root in fewer requests.
  const RendezvousBenchmarkResult hosted = benchmarkRendezvous(smallJob(true));
  EXPECT_LT(hosted.storeRequests, result.storeRequests);
}

// Reading every rank's record on every rank, as a communicator that connects to every peer
// at rendezvous did, passes N records through the root N times: more bytes than the host
// table, a host's records and the likely peers' that each rank reads now.
TEST(RendezvousBenchmarkTest, TheFullAddressBookIsTheHeavierBaseline) {
  RendezvousBenchmarkOptions options = smallJob(false);
  options.dropPercent = 0;
  const RendezvousBenchmarkResult needed = benchmarkRendezvous(options);
  options.fullAddressBook = true;
  const RendezvousBenchmarkResult full = benchmarkRendezvous(options);
  EXPECT_EQ(full.neighboursChecked, 2 * 64);
  EXPECT_GT(full.storeBytesSent, needed.storeBytesSent);
}

}  // namespace
}  // namespace kolo::launch
