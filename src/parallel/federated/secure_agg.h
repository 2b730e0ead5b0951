// Secure aggregation (Bonawitz et al. 2017, "Practical Secure Aggregation for
// Privacy-Preserving Machine Learning", semi-honest server): each client hides its quantised
// update under a self mask and pairwise masks that cancel in the sum; seeds come from X25519
// key agreement and are expanded by ChaCha20 (libsodium); Shamir shares of every client's
// seeds let the server remove the masks of clients that drop out, so it learns only the sum.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "kolo/comm/store.h"

namespace kolo::parallel::fed::sa {

using Key = std::array<uint8_t, 32>;

// ---- Shamir secret sharing over GF(2^61 - 1) ----

inline constexpr uint64_t kFieldPrime = (uint64_t{1} << 61) - 1;

/// One party's share: the point x (nonzero) and the polynomial's values there, one per
/// element of the secret.
struct Share {
  uint32_t x = 0;
  std::vector<uint64_t> y;
};

/// Splits every element of `secret` (each < kFieldPrime) with a random polynomial of degree
/// threshold - 1 per element; returns the shares at `xs` (distinct, nonzero). Any
/// `threshold` of them give the secret back; fewer reveal nothing about it.
std::vector<Share> shamirSplit(const std::vector<uint64_t>& secret, int threshold,
                               const std::vector<uint32_t>& xs);
/// Lagrange interpolation at 0 from the first `threshold` of `shares`; throws
/// InvalidArgument with fewer shares, repeated points or shares of different lengths.
std::vector<uint64_t> shamirCombine(const std::vector<Share>& shares, int threshold);

/// A 32-byte key as 8 field elements of 32 bits each, and back.
std::vector<uint64_t> keyToField(const Key& key);
Key fieldToKey(const std::vector<uint64_t>& values);

// ---- fixed point ----

/// Fractional bits of the fixed-point encoding: x is sent as round(x * 2^kScaleBits) mod 2^64.
inline constexpr int kScaleBits = 24;
/// The input of one client: round(weight * values[i] * 2^24) for every i, then the weight as
/// an integer, all mod 2^64. Throws InvalidArgument for a non-finite value or |weight *
/// value| >= 2^28 (the sum of up to 1024 clients must stay inside 2^62).
std::vector<uint64_t> quantize(const std::vector<float>& values, int64_t weight);
/// The sum of quantize()d inputs back to reals: the first n-1 entries as signed fixed point.
std::vector<double> dequantize(const std::vector<uint64_t>& sum);

// ---- the protocol's parties ----

/// The two public keys a client advertises: one to agree on the keys that encrypt its shares,
/// one to agree on its pairwise mask seeds.
struct PublicKeys {
  Key cipher{};
  Key mask{};
};

/// Adds sign * ChaCha20(seed, nonce = round) read as u64 words to `values` (mod 2^64).
void addMask(const Key& seed, int64_t round, bool subtract, std::vector<uint64_t>& values);
/// The pairwise mask seed of clients with mask keys (secretKey, its peer's publicKey).
Key pairSeed(const Key& secretKey, const Key& peerPublicKey, int64_t round);

/// One client in one round. Not copyable (holds secret keys).
class Client {
 public:
  /// Generates both key pairs and the self-mask seed.
  Client(int64_t round, int id, int threshold);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int id() const { return id_; }
  const PublicKeys& publicKeys() const { return public_; }
  /// Step 2: Shamir shares of the mask secret key and the self-mask seed for every client of
  /// `u1` (this one included), each encrypted and authenticated for its recipient with a key
  /// agreed from the cipher keys. Returns recipient -> ciphertext. Throws InvalidArgument
  /// when u1 has fewer than `threshold` clients or lacks this one.
  std::map<int, comm::Bytes> shareKeys(const std::map<int, PublicKeys>& u1);
  /// Step 3: input + self mask + pairwise masks with every other client of `u2` (added
  /// towards larger ids, subtracted towards smaller), mod 2^64.
  std::vector<uint64_t> maskInput(std::vector<uint64_t> input, const std::vector<int>& u2) const;
  /// Step 4: opens the shares addressed to it (`inbox`: sender -> ciphertext) and reveals,
  /// per sender of u2, the share of its self-mask seed if it is in `u3` (survived) or of its
  /// mask secret key if not. Throws FormatError for a ciphertext that does not authenticate.
  std::map<int, Share> unmask(const std::vector<int>& u2, const std::vector<int>& u3,
                              const std::map<int, comm::Bytes>& inbox) const;

 private:
  int64_t round_;
  int id_;
  int threshold_;
  PublicKeys public_;
  Key cipherSecret_{};
  Key maskSecret_{};
  Key selfSeed_{};
  std::map<int, PublicKeys> u1_;
};

/// The server's last step: the sum of the survivors' masked inputs (`masked`, U3) less their
/// self masks (seeds rebuilt from the revealed shares) and less the pairwise masks they share
/// with the clients of `u2` that dropped (mask keys rebuilt, and checked against the keys
/// they advertised in `u1`). `revealed`: revealer -> (owner -> share). Throws Error when
/// fewer than `threshold` shares of a needed secret were revealed, Mismatch when a rebuilt
/// key does not match its public key.
std::vector<uint64_t> unmaskSum(int64_t round, const std::map<int, std::vector<uint64_t>>& masked,
                                const std::map<int, PublicKeys>& u1, const std::vector<int>& u2,
                                const std::map<int, std::map<int, Share>>& revealed, int threshold);

}  // namespace kolo::parallel::fed::sa
