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

/// Publishes `me` as rank `rank`'s record and returns the records of `peers` (in that
/// order), waiting up to `timeout` for them to be published: one request for all of them.
/// Collective over the ranks that publish. Throws Timeout naming the ranks that did not
/// publish, FormatError naming a rank whose record does not decode.
std::vector<RankRecord> exchangeRankRecords(Store& store, const std::string& prefix, int rank,
                                            const RankRecord& me, const std::vector<int>& peers,
                                            std::chrono::milliseconds timeout);

/// Every rank of 0..size-1, for exchangeRankRecords when a rank needs them all (a
/// communicator that connects to every peer at once).
std::vector<int> allRanks(int size);

/// The host of every rank, as indices 0, 1, ... in order of each host's lowest rank. Rank
/// 0 reads every record in one request and publishes the table under PREFIX/hosts; a rank
/// that needs it (one per host: the others share its copy) reads it back. Call after the
/// ranks published their records. Throws Timeout, or FormatError for a malformed table.
std::vector<uint32_t> hostDirectory(Store& store, const std::string& prefix, int rank, int size,
                                    std::chrono::milliseconds timeout);

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
