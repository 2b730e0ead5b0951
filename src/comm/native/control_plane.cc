// The rendezvous' store operations (control_plane.h).
#include "comm/native/control_plane.h"

#include <algorithm>
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

void publishRankRecord(Store& store, const std::string& prefix, int rank, const RankRecord& me) {
  store.setString(recordKey(prefix, rank), encodeRankRecord(me));
}

std::vector<RankRecord> fetchRankRecords(Store& store, const std::string& prefix, const std::vector<int>& peers,
                                         std::chrono::milliseconds timeout) {
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

namespace {

/// hostDirectory; rank 0 also gets every record it read (empty elsewhere).
std::vector<uint32_t> readHostDirectory(Store& store, const std::string& prefix, int rank, int size,
                                        std::chrono::milliseconds timeout, std::vector<RankRecord>* records) {
  const std::string key = prefix + "hosts";
  if (rank == 0) {
    // Only the host id of each record matters here; the records are decoded whole anyway,
    // so that a malformed one is refused where it is read.
    std::vector<int> ranks(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
    *records = fetchRankRecords(store, prefix, ranks, timeout);
    std::vector<uint32_t> hostOf(static_cast<size_t>(size));
    std::map<std::string, uint32_t> index;
    for (int r = 0; r < size; ++r)
      hostOf[static_cast<size_t>(r)] =
          index.emplace((*records)[static_cast<size_t>(r)].hostId, static_cast<uint32_t>(index.size())).first->second;
    store.setString(key, encodeHostTable(hostOf));
    return hostOf;
  }
  return decodeHostTable(store.getString(key, timeout), size);
}

}  // namespace

std::vector<uint32_t> hostDirectory(Store& store, const std::string& prefix, int rank, int size,
                                    std::chrono::milliseconds timeout) {
  std::vector<RankRecord> records;
  return readHostDirectory(store, prefix, rank, size, timeout, &records);
}

std::vector<int> algorithmPartners(int rank, int size) {
  std::vector<int> out;
  const auto add = [&](int q) {
    if (q >= 0 && q < size && q != rank) out.push_back(q);
  };
  add((rank + 1) % size);
  add((rank + size - 1) % size);
  for (int d = 1; d < size; d *= 2) {
    add((rank + d) % size);
    add(((rank - d) % size + size) % size);
  }
  if (rank != 0) add(rank & (rank - 1));  // the binomial tree's parent; its children are rank + 2^k
  int p = 1;
  while (p * 2 <= size) p *= 2;
  const int extra = size - p;
  int vrank = rank - extra;
  if (rank < 2 * extra) {
    add(rank % 2 == 0 ? rank + 1 : rank - 1);
    vrank = rank % 2 == 0 ? -1 : rank / 2;  // an even rank folded out talks to rank + 1 only
  }
  if (vrank >= 0)
    for (int m = 1; m < p; m <<= 1) {
      const int v = vrank ^ m;
      add(v < extra ? 2 * v + 1 : v + extra);
    }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> likelyPeers(int rank, const std::vector<uint32_t>& hostOf, bool sharedMemory) {
  const int size = static_cast<int>(hostOf.size());
  std::vector<std::vector<int>> hostRanks;
  for (int r = 0; r < size; ++r) {
    const uint32_t h = hostOf[static_cast<size_t>(r)];
    if (h >= hostRanks.size()) hostRanks.resize(h + 1);
    hostRanks[h].push_back(r);
  }
  const int myHost = static_cast<int>(hostOf[static_cast<size_t>(rank)]);
  const std::vector<int>& mine = hostRanks[static_cast<size_t>(myHost)];
  const int myLocal = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  std::vector<int> peers = algorithmPartners(rank, size);
  // Reduce-to-one and the flat tree pair rank 0 with every rank.
  if (rank == 0) {
    for (int r = 1; r < size; ++r) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  const int hosts = static_cast<int>(hostRanks.size());
  const std::vector<int> hostPartners = algorithmPartners(myHost, hosts);
  if (myLocal == 0)
    for (int h : hostPartners) peers.push_back(hostRanks[static_cast<size_t>(h)].front());
  const bool evenHosts = std::all_of(hostRanks.begin(), hostRanks.end(),
                                     [&](const std::vector<int>& ranks) { return ranks.size() == mine.size(); });
  if (evenHosts)
    for (int h : hostPartners) peers.push_back(hostRanks[static_cast<size_t>(h)][static_cast<size_t>(myLocal)]);
  std::erase_if(peers, [&](int q) {
    return q == rank || (sharedMemory && mine.size() > 1 && hostOf[static_cast<size_t>(q)] == hostOf[static_cast<size_t>(rank)]);
  });
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

RendezvousView joinRendezvous(Store& store, const std::string& prefix, int rank, int size, const RankRecord& me,
                              bool sharedMemory, std::chrono::milliseconds timeout) {
  RendezvousView view;
  publishRankRecord(store, prefix, rank, me);
  shareJobToken(store, prefix, rank, view.token, timeout);
  std::vector<RankRecord> everyRecord;  // rank 0's, read for the host table
  view.hostOf = readHostDirectory(store, prefix, rank, size, timeout, &everyRecord);
  const uint32_t myHost = view.hostOf[static_cast<size_t>(rank)];
  for (int r = 0; r < size; ++r)
    if (view.hostOf[static_cast<size_t>(r)] == myHost) view.localRanks.push_back(r);
  view.likelyRanks = likelyPeers(rank, view.hostOf, sharedMemory);
  if (rank == 0) {
    for (int r : view.localRanks) view.localRecords.push_back(everyRecord[static_cast<size_t>(r)]);
    for (int r : view.likelyRanks) view.likelyRecords.push_back(everyRecord[static_cast<size_t>(r)]);
    return view;
  }
  // One request for this host's records and the likely peers' (the two sets are apart
  // unless shared memory is off, when the local ones are read twice).
  std::vector<int> wanted;
  if (view.localRanks.size() > 1) wanted = view.localRanks;
  wanted.insert(wanted.end(), view.likelyRanks.begin(), view.likelyRanks.end());
  std::vector<RankRecord> records =
      wanted.empty() ? std::vector<RankRecord>{} : fetchRankRecords(store, prefix, wanted, timeout);
  if (view.localRanks.size() > 1) {
    view.localRecords.assign(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(view.localRanks.size()));
    records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(view.localRanks.size()));
  } else {
    view.localRecords = {me};
  }
  view.likelyRecords = std::move(records);
  return view;
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
