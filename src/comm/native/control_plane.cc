// The rendezvous' store operations (control_plane.h).
#include "comm/native/control_plane.h"

#include <cstring>

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

std::vector<RankRecord> exchangeRankRecords(Store& store, const std::string& prefix, int rank, int size,
                                            const RankRecord& me, std::chrono::milliseconds timeout) {
  store.setString(prefix + "rank/" + std::to_string(rank), encodeRankRecord(me));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + "rank/" + std::to_string(r));
  store.wait(keys, timeout);
  std::vector<RankRecord> records(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) records[r] = decodeRankRecord(store.getString(keys[r], timeout), r);
  return records;
}

bool agreeAll(Store& store, const std::string& prefix, const std::string& name, int rank, int size, bool mine,
              std::chrono::milliseconds timeout) {
  const std::string base = prefix + name + "/";
  store.setString(base + std::to_string(rank), mine ? "1" : "0");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
  store.wait(keys, timeout);
  bool all = true;
  for (int r = 0; r < size && all; ++r) all = store.getString(keys[r], timeout) == "1";
  return all;
}

void storeBarrier(Store& store, const std::string& key, int size, std::chrono::milliseconds timeout) {
  if (store.add(key + "/arrived", 1) == size) store.setString(key + "/open", "1");
  store.wait({key + "/open"}, timeout);
}

}  // namespace kolo::comm::native
