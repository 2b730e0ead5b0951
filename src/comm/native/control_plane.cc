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

HostTable::HostTable(std::vector<HostRun> runs) : runs_(std::move(runs)), nextRun_(runs_.size(), kNoRun) {
  std::vector<uint32_t> lastRun;
  for (size_t i = 0; i < runs_.size(); ++i) {
    const HostRun& run = runs_[i];
    if (run.host >= counts_.size()) {
      counts_.resize(run.host + 1, 0);
      firstRun_.resize(run.host + 1, kNoRun);
      lastRun.resize(run.host + 1, kNoRun);
    }
    const auto index = static_cast<uint32_t>(i);
    if (firstRun_[run.host] == kNoRun) {
      firstRun_[run.host] = index;
    } else {
      nextRun_[lastRun[run.host]] = index;
    }
    lastRun[run.host] = index;
    counts_[run.host] += static_cast<int>(run.count);
    size_ += static_cast<int>(run.count);
  }
  even_ = std::all_of(counts_.begin(), counts_.end(), [&](int c) { return c == counts_.front(); });
}

uint32_t HostTable::hostOf(int rank) const {
  // The last run that starts at or before `rank`.
  const auto after = std::upper_bound(runs_.begin(), runs_.end(), static_cast<uint32_t>(rank),
                                      [](uint32_t r, const HostRun& run) { return r < run.first; });
  return std::prev(after)->host;
}

std::vector<int> HostTable::ranksOf(uint32_t host) const {
  std::vector<int> ranks;
  for (uint32_t i = firstRun_[host]; i != kNoRun; i = nextRun_[i])
    for (uint32_t k = 0; k < runs_[i].count; ++k) ranks.push_back(static_cast<int>(runs_[i].first + k));
  return ranks;
}

int HostTable::rankOf(uint32_t host, int index) const {
  for (uint32_t i = firstRun_[host]; i != kNoRun; i = nextRun_[i]) {
    if (index < static_cast<int>(runs_[i].count)) return static_cast<int>(runs_[i].first) + index;
    index -= static_cast<int>(runs_[i].count);
  }
  return -1;
}

std::vector<uint32_t> HostTable::expand() const {
  std::vector<uint32_t> hostOf;
  hostOf.reserve(static_cast<size_t>(size_));
  for (const HostRun& run : runs_) hostOf.insert(hostOf.end(), run.count, run.host);
  return hostOf;
}

namespace {

/// hostDirectory; rank 0 also gets every record it read (empty elsewhere).
HostTable readHostDirectory(Store& store, const std::string& prefix, int rank, int size,
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
    const std::string table = encodeHostTable(hostOf);
    store.setString(key, table);
    return HostTable(decodeHostRuns(table, size));
  }
  return HostTable(decodeHostRuns(store.getString(key, timeout), size));
}

}  // namespace

HostTable hostDirectory(Store& store, const std::string& prefix, int rank, int size,
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

std::vector<int> likelyPeers(int rank, const HostTable& hosts, bool sharedMemory) {
  const int size = hosts.size();
  const uint32_t myHost = hosts.hostOf(rank);
  const std::vector<int> mine = hosts.ranksOf(myHost);
  const int myLocal = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  std::vector<int> peers = algorithmPartners(rank, size);
  // Reduce-to-one and the flat tree pair rank 0 with every rank.
  if (rank == 0) {
    for (int r = 1; r < size; ++r) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  const std::vector<int> hostPartners = algorithmPartners(static_cast<int>(myHost), hosts.hosts());
  if (myLocal == 0)
    for (int h : hostPartners) peers.push_back(hosts.rankOf(static_cast<uint32_t>(h), 0));
  if (hosts.evenHosts())
    for (int h : hostPartners) peers.push_back(hosts.rankOf(static_cast<uint32_t>(h), myLocal));
  std::erase_if(peers, [&](int q) {
    return q == rank || (sharedMemory && mine.size() > 1 && hosts.hostOf(q) == myHost);
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
  view.hosts = readHostDirectory(store, prefix, rank, size, timeout, &everyRecord);
  view.localRanks = view.hosts.ranksOf(view.hosts.hostOf(rank));
  view.likelyRanks = likelyPeers(rank, view.hosts, sharedMemory);
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
