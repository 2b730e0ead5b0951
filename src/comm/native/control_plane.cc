// The rendezvous' store operations (control_plane.h).
#include "comm/native/control_plane.h"

#include <cstring>
#include <map>

#include "comm/token.h"
#include "kolo/error.h"

namespace kolo::comm::native {

void shareJobToken(Store& store, const std::string& prefix, int rank, uint8_t (&token)[kJobTokenBytes],
                   std::chrono::milliseconds timeout) {
  if (rank == 0) {
    detail::randomBytes(token, kJobTokenBytes);
    store.set(prefix + "token", Bytes(token, token + kJobTokenBytes));
    return;
  }
  const Bytes stored = store.get(prefix + "token", timeout);
  if (stored.size() != kJobTokenBytes)
    KOLO_THROW(FormatError, "job token in the store has ", stored.size(), " bytes, not ", kJobTokenBytes);
  std::memcpy(token, stored.data(), kJobTokenBytes);
}

namespace {

std::string recordKey(const std::string& prefix, int rank) { return prefix + "rank/" + std::to_string(rank); }

}  // namespace

std::vector<RankRecord> exchangeRankRecords(Store& store, const std::string& prefix, int rank,
                                            const RankRecord& me, const std::vector<int>& peers,
                                            std::chrono::milliseconds timeout) {
  store.setString(recordKey(prefix, rank), encodeRankRecord(me));
  std::vector<std::string> keys;
  keys.reserve(peers.size());
  for (int peer : peers) keys.push_back(recordKey(prefix, peer));
  const std::vector<Bytes> values = store.multiGet(keys, timeout);
  std::vector<RankRecord> records;
  records.reserve(peers.size());
  for (size_t i = 0; i < peers.size(); ++i)
    records.push_back(decodeRankRecord(std::string(values[i].begin(), values[i].end()), peers[i]));
  return records;
}

std::vector<int> allRanks(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

std::vector<uint32_t> hostDirectory(Store& store, const std::string& prefix, int rank, int size,
                                    std::chrono::milliseconds timeout) {
  const std::string key = prefix + "hosts";
  std::vector<uint32_t> hostOf(static_cast<size_t>(size));
  if (rank == 0) {
    // Only the host id of each record matters here; the records are decoded whole anyway,
    // so that a malformed one is refused where it is read.
    std::vector<std::string> keys;
    keys.reserve(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) keys.push_back(recordKey(prefix, r));
    const std::vector<Bytes> values = store.multiGet(keys, timeout);
    std::map<std::string, uint32_t> index;
    for (int r = 0; r < size; ++r) {
      const RankRecord record =
          decodeRankRecord(std::string(values[static_cast<size_t>(r)].begin(), values[static_cast<size_t>(r)].end()), r);
      hostOf[static_cast<size_t>(r)] =
          index.emplace(record.hostId, static_cast<uint32_t>(index.size())).first->second;
    }
    Bytes table(hostOf.size() * 4);
    std::memcpy(table.data(), hostOf.data(), table.size());
    store.set(key, table);
    return hostOf;
  }
  const Bytes table = store.get(key, timeout);
  if (table.size() != hostOf.size() * 4)
    KOLO_THROW(FormatError, "host table in the store has ", table.size(), " bytes, not 4 for each of ", size,
               " ranks");
  std::memcpy(hostOf.data(), table.data(), table.size());
  for (uint32_t host : hostOf)
    if (host >= static_cast<uint32_t>(size)) KOLO_THROW(FormatError, "host table names host ", host, " of ", size);
  return hostOf;
}

bool agreeAll(Store& store, const std::string& prefix, const std::string& name, int size, bool mine,
              std::chrono::milliseconds timeout) {
  const std::string base = prefix + name + "/";
  if (!mine) store.add(base + "no", 1);
  store.arrive(base + "arrived", size, timeout);
  return mine && store.add(base + "no", 0) == 0;
}

void storeBarrier(Store& store, const std::string& key, int size, std::chrono::milliseconds timeout) {
  store.arrive(key, size, timeout);
}

}  // namespace kolo::comm::native
