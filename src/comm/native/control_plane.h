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

/// Publishes `me` as rank `rank`'s record and returns every rank's record, index = rank.
/// Collective over the `size` ranks. Throws Timeout naming the ranks that did not publish,
/// FormatError naming a rank whose record does not decode.
std::vector<RankRecord> exchangeRankRecords(Store& store, const std::string& prefix, int rank, int size,
                                            const RankRecord& me, std::chrono::milliseconds timeout);

/// Collective over the `size` ranks: true when every rank passed `mine` = true. The keys
/// live under PREFIX/NAME/. Throws Timeout when a rank does not take part within `timeout`.
bool agreeAll(Store& store, const std::string& prefix, const std::string& name, int rank, int size, bool mine,
              std::chrono::milliseconds timeout);

/// Collective over the `size` ranks: returns once all have called it with the same `key`
/// (a counter under KEY/arrived; the last arrival opens KEY/open, which everyone waits for).
/// One use per key. Throws Timeout when a rank does not arrive within `timeout`.
void storeBarrier(Store& store, const std::string& key, int size, std::chrono::milliseconds timeout);

}  // namespace kolo::comm::native
