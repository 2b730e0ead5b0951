// The parties of secure aggregation (secure_agg.h): X25519 key agreement
// (crypto_scalarmult), BLAKE2b key derivation (crypto_generichash), ChaCha20 mask expansion
// (crypto_stream_chacha20) and XSalsa20-Poly1305 boxes for the Shamir shares
// (crypto_secretbox); all from libsodium.
#include "parallel/federated/secure_agg.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "kolo/error.h"
#include "parallel/federated/detail.h"

namespace kolo::parallel::fed::sa {
namespace {

void initSodium() { KOLO_REQUIRE(sodium_init() >= 0, "libsodium failed to initialise"); }

Key randomKey() {
  Key key{};
  randombytes_buf(key.data(), key.size());
  return key;
}

Key publicKeyOf(const Key& secret) {
  Key pub{};
  crypto_scalarmult_base(pub.data(), secret.data());
  return pub;
}

// BLAKE2b(X25519(secret, peer) || tag || round): a key both ends of the pair derive.
Key agree(const Key& secret, const Key& peer, const char* tag, int64_t round) {
  uint8_t shared[crypto_scalarmult_BYTES];
  if (crypto_scalarmult(shared, secret.data(), peer.data()) != 0)
    KOLO_THROW(InvalidArgument, "secure aggregation: a peer's public key is a weak point");
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, 32);
  crypto_generichash_update(&state, shared, sizeof shared);
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(tag), std::strlen(tag));
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(&round), sizeof round);
  Key key{};
  crypto_generichash_final(&state, key.data(), key.size());
  sodium_memzero(shared, sizeof shared);
  return key;
}

// Fresh keys every round: the nonce only has to differ between the pair's two directions.
void shareNonce(uint8_t* nonce, int64_t round, int from, int to) {
  std::memset(nonce, 0, crypto_secretbox_NONCEBYTES);
  std::memcpy(nonce, &round, sizeof round);
  std::memcpy(nonce + 8, &from, sizeof from);
  std::memcpy(nonce + 12, &to, sizeof to);
}

constexpr size_t kShareElements = 8;                        // a 32-byte key as field elements
constexpr size_t kSharePlain = 8 + 2 * kShareElements * 8;  // from, to, sk share, seed share

}  // namespace

void addMask(const Key& seed, int64_t round, bool subtract, std::vector<uint64_t>& values) {
  initSodium();
  std::vector<uint64_t> stream(values.size());
  uint8_t nonce[crypto_stream_chacha20_NONCEBYTES] = {};
  std::memcpy(nonce, &round, std::min(sizeof nonce, sizeof round));
  crypto_stream_chacha20(reinterpret_cast<uint8_t*>(stream.data()),
                         stream.size() * sizeof(uint64_t), nonce, seed.data());
  if (subtract) {
    for (size_t i = 0; i < values.size(); ++i) values[i] -= stream[i];
  } else {
    for (size_t i = 0; i < values.size(); ++i) values[i] += stream[i];
  }
}

Key pairSeed(const Key& secretKey, const Key& peerPublicKey, int64_t round) {
  return agree(secretKey, peerPublicKey, "kolo-sa-mask", round);
}

Client::Client(int64_t round, int id, int threshold)
    : round_(round), id_(id), threshold_(threshold) {
  initSodium();
  cipherSecret_ = randomKey();
  maskSecret_ = randomKey();
  selfSeed_ = randomKey();
  public_.cipher = publicKeyOf(cipherSecret_);
  public_.mask = publicKeyOf(maskSecret_);
}

Client::~Client() {
  sodium_memzero(cipherSecret_.data(), cipherSecret_.size());
  sodium_memzero(maskSecret_.data(), maskSecret_.size());
  sodium_memzero(selfSeed_.data(), selfSeed_.size());
}

std::map<int, comm::Bytes> Client::shareKeys(const std::map<int, PublicKeys>& u1) {
  KOLO_REQUIRE(u1.count(id_), "secure aggregation: client ", id_,
               " is not among the round's clients");
  KOLO_REQUIRE(u1.size() >= static_cast<size_t>(threshold_), "secure aggregation: ", u1.size(),
               " clients advertised keys, fewer than the threshold ", threshold_);
  u1_ = u1;
  std::vector<uint32_t> xs;
  for (const auto& [peer, keys] : u1) xs.push_back(static_cast<uint32_t>(peer) + 1);
  const std::vector<Share> skShares = shamirSplit(keyToField(maskSecret_), threshold_, xs);
  const std::vector<Share> seedShares = shamirSplit(keyToField(selfSeed_), threshold_, xs);
  std::map<int, comm::Bytes> out;
  size_t j = 0;
  for (const auto& [peer, keys] : u1) {
    detail::Writer plain;
    plain.put(static_cast<int32_t>(id_));
    plain.put(static_cast<int32_t>(peer));
    plain.putBytes(skShares[j].y.data(), kShareElements * 8);
    plain.putBytes(seedShares[j].y.data(), kShareElements * 8);
    ++j;
    const Key key = agree(cipherSecret_, keys.cipher, "kolo-sa-share", round_);
    uint8_t nonce[crypto_secretbox_NONCEBYTES];
    shareNonce(nonce, round_, id_, peer);
    comm::Bytes box(plain.bytes.size() + crypto_secretbox_MACBYTES);
    crypto_secretbox_easy(box.data(), plain.bytes.data(), plain.bytes.size(), nonce, key.data());
    sodium_memzero(plain.bytes.data(), plain.bytes.size());
    out[peer] = std::move(box);
  }
  return out;
}

std::vector<uint64_t> Client::maskInput(std::vector<uint64_t> input,
                                        const std::vector<int>& u2) const {
  addMask(selfSeed_, round_, false, input);
  for (int peer : u2) {
    if (peer == id_) continue;
    auto keys = u1_.find(peer);
    KOLO_REQUIRE(keys != u1_.end(), "secure aggregation: client ", peer,
                 " of the masking set did not advertise keys");
    // Towards a larger id the mask is added, towards a smaller one subtracted: they cancel.
    addMask(pairSeed(maskSecret_, keys->second.mask, round_), round_, peer < id_, input);
  }
  return input;
}

std::map<int, Share> Client::unmask(const std::vector<int>& u2, const std::vector<int>& u3,
                                    const std::map<int, comm::Bytes>& inbox) const {
  std::map<int, Share> reveal;
  for (int sender : u2) {
    auto box = inbox.find(sender);
    auto keys = u1_.find(sender);
    if (box == inbox.end() || keys == u1_.end()) continue;
    KOLO_REQUIRE(box->second.size() == kSharePlain + crypto_secretbox_MACBYTES,
                 "secure aggregation: the shares from client ", sender, " to client ", id_,
                 " have ", box->second.size(), " bytes");
    const Key key = agree(cipherSecret_, keys->second.cipher, "kolo-sa-share", round_);
    uint8_t nonce[crypto_secretbox_NONCEBYTES];
    shareNonce(nonce, round_, sender, id_);
    comm::Bytes plain(kSharePlain);
    if (crypto_secretbox_open_easy(plain.data(), box->second.data(), box->second.size(), nonce,
                                   key.data()) != 0)
      KOLO_THROW(FormatError, "secure aggregation: the shares from client ", sender, " to client ",
                 id_, " do not authenticate");
    detail::Reader r(plain, "shares from client " + std::to_string(sender));
    const int32_t from = r.get<int32_t>(), to = r.get<int32_t>();
    KOLO_REQUIRE(from == sender && to == id_, "secure aggregation: shares addressed from ", from,
                 " to ", to, " arrived as from ", sender, " to ", id_);
    Share sk{static_cast<uint32_t>(id_) + 1, std::vector<uint64_t>(kShareElements)};
    Share seed{static_cast<uint32_t>(id_) + 1, std::vector<uint64_t>(kShareElements)};
    r.take(sk.y.data(), kShareElements * 8);
    r.take(seed.y.data(), kShareElements * 8);
    // A survivor's seed or a dropped client's mask key, never both: both would unmask it.
    const bool survived = std::find(u3.begin(), u3.end(), sender) != u3.end();
    reveal[sender] = survived ? seed : sk;
    sodium_memzero(plain.data(), plain.size());
  }
  return reveal;
}

std::vector<uint64_t> unmaskSum(int64_t round, const std::map<int, std::vector<uint64_t>>& masked,
                                const std::map<int, PublicKeys>& u1, const std::vector<int>& u2,
                                const std::map<int, std::map<int, Share>>& revealed,
                                int threshold) {
  KOLO_REQUIRE(!masked.empty(), "secure aggregation: no masked input to sum");
  const size_t length = masked.begin()->second.size();
  std::vector<uint64_t> sum(length, 0);
  for (const auto& [client, input] : masked) {
    KOLO_CHECK_EQ(input.size(), length, "secure aggregation: masked input of client ", client);
    for (size_t i = 0; i < length; ++i) sum[i] += input[i];
  }
  auto rebuild = [&](int owner) {
    std::vector<Share> shares;
    for (const auto& [revealer, byOwner] : revealed) {
      auto share = byOwner.find(owner);
      if (share != byOwner.end()) shares.push_back(share->second);
    }
    if (shares.size() < static_cast<size_t>(threshold))
      KOLO_THROW(Error, "secure aggregation: round ", round, ": only ", shares.size(),
                 " shares of client ", owner, "'s secret were revealed, the threshold is ",
                 threshold);
    return fieldToKey(shamirCombine(shares, threshold));
  };
  for (const auto& [client, input] : masked) addMask(rebuild(client), round, true, sum);
  for (int dropped : u2) {
    if (masked.count(dropped)) continue;
    const Key secret = rebuild(dropped);
    auto keys = u1.find(dropped);
    KOLO_REQUIRE(keys != u1.end(), "secure aggregation: dropped client ", dropped, " has no keys");
    if (publicKeyOf(secret) != keys->second.mask)
      KOLO_THROW(Mismatch, "secure aggregation: round ", round,
                 ": the mask key rebuilt for client ", dropped,
                 " does not match the key it advertised");
    for (const auto& [survivor, input] : masked) {
      // The survivor added the pair's mask if the dropped client's id is larger: take it out.
      addMask(pairSeed(secret, u1.at(survivor).mask, round), round, dropped > survivor, sum);
    }
  }
  return sum;
}

}  // namespace kolo::parallel::fed::sa
