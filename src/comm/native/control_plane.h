// The store side of the native backend's rendezvous, apart from sockets and shared memory:
// the job token, the exchange of rank records and the agreement on a yes/no every rank
// gives. createNativeCommunicator and `kolo bench rendezvous` (which runs thousands of
// ranks' control plane without their data plane) call the same functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/native/rank_record.h"
#include "kolo/comm/store.h"

namespace kolo::comm::native {

inline constexpr size_t kJobTokenBytes = 16;

/// Rank 0 draws the job token and publishes it under PREFIX/token; the others read it
/// (waiting up to `timeout`). Throws FormatError when the stored token has the wrong size,
/// Timeout when rank 0 does not publish it in time.
void shareJobToken(Store& store, const std::string& prefix, int rank, uint8_t (&token)[kJobTokenBytes],
                   std::chrono::milliseconds timeout);

/// Publishes `me` as rank `rank`'s record.
void publishRankRecord(Store& store, const std::string& prefix, int rank, const RankRecord& me);

/// The records of `peers` (in that order), waiting up to `timeout` for them to be
/// published: one request for all of them. Throws Timeout naming the ranks that did not
/// publish, FormatError naming a rank whose record does not decode.
std::vector<RankRecord> fetchRankRecords(Store& store, const std::string& prefix, const std::vector<int>& peers,
                                         std::chrono::milliseconds timeout);

/// Which host each rank is on, as indices 0, 1, ... in order of each host's lowest rank,
/// kept as the host table's runs: O(runs + hosts) memory, so that a rank's rendezvous does
/// not grow with the job's rank count when hosts hold consecutive ranks.
class HostTable {
 public:
  /// Runs as decodeHostRuns returns them (in rank order, adding up to the size).
  explicit HostTable(std::vector<HostRun> runs);
  int size() const { return size_; }
  int hosts() const { return static_cast<int>(counts_.size()); }
  /// The host of `rank` (a binary search over the runs).
  uint32_t hostOf(int rank) const;
  /// How many ranks `host` has.
  int countOf(uint32_t host) const { return counts_[host]; }
  /// The ranks of `host`, ascending.
  std::vector<int> ranksOf(uint32_t host) const;
  /// The `index`-th rank of `host` (0 = its lowest); -1 when it has fewer.
  int rankOf(uint32_t host, int index) const;
  /// Whether every host has as many ranks.
  bool evenHosts() const { return even_; }
  /// Every rank's host, by rank: O(size).
  std::vector<uint32_t> expand() const;

 private:
  static constexpr uint32_t kNoRun = ~uint32_t{0};
  std::vector<HostRun> runs_;
  // A host's runs as a chain: its first run's index, then each run's next on its host.
  std::vector<uint32_t> firstRun_;
  std::vector<uint32_t> nextRun_;
  std::vector<int> counts_;
  int size_ = 0;
  bool even_ = true;
};

/// The host of every rank, as indices 0, 1, ... in order of each host's lowest rank. Rank
/// 0 reads every record in one request and publishes the table (encodeHostTable: 12 bytes
/// when every host holds as many consecutive ranks) under PREFIX/hosts; the others
/// read it back, one request each. Call after publishing this rank's record. Throws
/// Timeout, or FormatError for a malformed table or record.
HostTable hostDirectory(Store& store, const std::string& prefix, int rank, int size,
                        std::chrono::milliseconds timeout);

/// The ranks that the built-in algorithms of a group of `size` pair group rank `rank` with
/// when they are rooted at rank 0: ring and chain neighbours, the dissemination barrier's
/// partners (rank ± 2^k), the binomial tree's parent and children, and recursive
/// halving-doubling's partners (after its fold of size - 2^k ranks). At most about
/// 4 log2(size) ranks, ascending, without `rank`.
std::vector<int> algorithmPartners(int rank, int size);

/// The peers whose records a rank reads at rendezvous, so that the world group's built-in
/// collectives rooted at rank 0 connect without the store: algorithmPartners among all
/// ranks, rank 0 (reduce-to-one and the flat tree pair it with every rank: rank 0's set is
/// every rank, whose records it reads for the host table anyway), and, for the
/// hierarchical algorithm, algorithmPartners among the hosts' first ranks (for a first
/// rank) and among the ranks with this rank's local index (when every host has as many
/// ranks). Only peers reached over TCP: not those on this host when `sharedMemory` and the
/// host has other ranks.
std::vector<int> likelyPeers(int rank, const HostTable& hosts, bool sharedMemory);

/// What a rank learns from the store before it touches any peer.
struct RendezvousView {
  uint8_t token[kJobTokenBytes] = {};
  /// Every rank's host (hostDirectory).
  HostTable hosts{{HostRun{0, 1, 0}}};
  /// This rank's host's ranks, ascending, and their records (this rank's own among them).
  std::vector<int> localRanks;
  std::vector<RankRecord> localRecords;
  /// likelyPeers and their records.
  std::vector<int> likelyRanks;
  std::vector<RankRecord> likelyRecords;
};

/// createNativeCommunicator's rendezvous through the store: publishes `me`, shares the job
/// token, reads the host table, then the records of this host's ranks and of likelyPeers
/// (one request for both; none when there are neither). A rank's requests are O(1) and its
/// bytes O(runs of the host table + ranks on its host + log size); rank 0 reads every
/// record once, and keeps them. Where other peers listen is left to fetchRankRecords, when a connection
/// to one is first needed. Collective over the `size` ranks; throws Timeout or FormatError.
RendezvousView joinRendezvous(Store& store, const std::string& prefix, int rank, int size, const RankRecord& me,
                              bool sharedMemory, std::chrono::milliseconds timeout);

/// Collective over the `size` ranks: true when every rank passed `mine` = true. Ranks that
/// say no count themselves on PREFIX/NAME/no before a counter barrier, so a rank makes two
/// or three requests whatever the size. Throws Timeout when a rank does not take part
/// within `timeout`.
bool agreeAll(Store& store, const std::string& prefix, const std::string& name, int size, bool mine,
              std::chrono::milliseconds timeout);

/// Collective over the `size` ranks: returns once all have called it with the same `key`
/// (Store::arrive: one request each, answered together when the last arrives). One use per
/// key. Throws Timeout when a rank does not arrive within `timeout`.
void storeBarrier(Store& store, const std::string& key, int size, std::chrono::milliseconds timeout);

}  // namespace kolo::comm::native
