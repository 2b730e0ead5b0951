// Encoders and checked decoders of the secure-aggregation frames (sa_wire.h).
#include "parallel/federated/sa_wire.h"

#include "kolo/error.h"
#include "parallel/federated/detail.h"

namespace kolo::parallel::fed::sa {
namespace {

constexpr uint32_t kMaxEntries = 1u << 20;
constexpr uint32_t kMaxBox = 4096;

uint32_t count(detail::Reader& r, size_t minEntryBytes) {
  const uint32_t n = r.get<uint32_t>();
  if (n > kMaxEntries || n * minEntryBytes > r.left())
    KOLO_THROW(FormatError, r.from(), ": the frame announces ", n, " entries in ", r.left(),
               " bytes");
  return n;
}

void done(const detail::Reader& r) {
  if (r.left() != 0) KOLO_THROW(FormatError, r.from(), ": ", r.left(), " bytes after the frame");
}

}  // namespace

comm::Bytes encodeKeys(const PublicKeys& keys) {
  detail::Writer w;
  w.put(keys.cipher);
  w.put(keys.mask);
  return std::move(w.bytes);
}

PublicKeys decodeKeys(const comm::Bytes& bytes, const std::string& from) {
  detail::Reader r(bytes, from);
  PublicKeys keys;
  keys.cipher = r.get<Key>();
  keys.mask = r.get<Key>();
  done(r);
  return keys;
}

comm::Bytes encodeKeyList(const std::map<int, PublicKeys>& keys) {
  detail::Writer w;
  w.put(static_cast<uint32_t>(keys.size()));
  for (const auto& [id, k] : keys) {
    w.put(static_cast<int32_t>(id));
    w.put(k.cipher);
    w.put(k.mask);
  }
  return std::move(w.bytes);
}

std::map<int, PublicKeys> decodeKeyList(const comm::Bytes& bytes, const std::string& from) {
  detail::Reader r(bytes, from);
  std::map<int, PublicKeys> keys;
  for (uint32_t n = count(r, 68); n > 0; --n) {
    const int id = r.get<int32_t>();
    PublicKeys& k = keys[id];
    k.cipher = r.get<Key>();
    k.mask = r.get<Key>();
  }
  done(r);
  return keys;
}

comm::Bytes encodeIds(const std::vector<int>& ids) {
  detail::Writer w;
  w.put(static_cast<uint32_t>(ids.size()));
  for (int id : ids) w.put(static_cast<int32_t>(id));
  return std::move(w.bytes);
}

std::vector<int> decodeIds(const comm::Bytes& bytes, const std::string& from) {
  detail::Reader r(bytes, from);
  std::vector<int> ids(count(r, 4));
  for (int& id : ids) id = r.get<int32_t>();
  done(r);
  return ids;
}

comm::Bytes encodeBoxes(const std::map<int, comm::Bytes>& boxes) {
  detail::Writer w;
  w.put(static_cast<uint32_t>(boxes.size()));
  for (const auto& [id, box] : boxes) {
    w.put(static_cast<int32_t>(id));
    w.put(static_cast<uint32_t>(box.size()));
    w.putBytes(box.data(), box.size());
  }
  return std::move(w.bytes);
}

std::map<int, comm::Bytes> decodeBoxes(const comm::Bytes& bytes, const std::string& from) {
  detail::Reader r(bytes, from);
  std::map<int, comm::Bytes> boxes;
  for (uint32_t n = count(r, 8); n > 0; --n) {
    const int id = r.get<int32_t>();
    const uint32_t size = r.get<uint32_t>();
    if (size > kMaxBox || size > r.left())
      KOLO_THROW(FormatError, from, ": a box of ", size, " bytes (at most ", kMaxBox, ")");
    comm::Bytes& box = boxes[id];
    box.resize(size);
    r.take(box.data(), size);
  }
  done(r);
  return boxes;
}

comm::Bytes encodeMasked(int64_t round, int client, const std::vector<uint64_t>& words) {
  detail::Writer w;
  w.put(round);
  w.put(static_cast<int32_t>(client));
  w.put(static_cast<uint64_t>(words.size()));
  w.putBytes(words.data(), words.size() * sizeof(uint64_t));
  return std::move(w.bytes);
}

std::vector<uint64_t> decodeMasked(const comm::Bytes& bytes, int64_t round, int client,
                                   size_t length) {
  const std::string who = "client " + std::to_string(client);
  detail::Reader r(bytes, who);
  const int64_t sentRound = r.get<int64_t>();
  const int sentClient = r.get<int32_t>();
  const uint64_t n = r.get<uint64_t>();
  if (sentRound != round)
    KOLO_THROW(Mismatch, who, " sent a masked input for round ", sentRound, " in round ", round,
               sentRound < round ? " (stale)" : " (ahead)", "; refused");
  if (sentClient != client)
    KOLO_THROW(Mismatch, who, " sent a masked input labelled client ", sentClient, "; refused");
  if (n != length)
    KOLO_THROW(Mismatch, who, " sent a masked input of ", n, " words, the model needs ", length,
               "; refused");
  r.expect(n, sizeof(uint64_t), "words");
  std::vector<uint64_t> words(n);
  r.take(words.data(), n * sizeof(uint64_t));
  return words;
}

comm::Bytes encodeReveal(const std::map<int, Share>& shares) {
  detail::Writer w;
  w.put(static_cast<uint32_t>(shares.size()));
  for (const auto& [owner, share] : shares) {
    w.put(static_cast<int32_t>(owner));
    w.put(share.x);
    w.putBytes(share.y.data(), 8 * sizeof(uint64_t));
  }
  return std::move(w.bytes);
}

std::map<int, Share> decodeReveal(const comm::Bytes& bytes, const std::string& from) {
  detail::Reader r(bytes, from);
  std::map<int, Share> shares;
  for (uint32_t n = count(r, 72); n > 0; --n) {
    const int owner = r.get<int32_t>();
    Share& share = shares[owner];
    share.x = r.get<uint32_t>();
    share.y.resize(8);
    r.take(share.y.data(), 8 * sizeof(uint64_t));
  }
  done(r);
  return shares;
}

}  // namespace kolo::parallel::fed::sa
