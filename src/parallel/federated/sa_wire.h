// The frames of secure aggregation in the store: key lists, id lists, boxes of shares, masked
// inputs and revealed shares. Every decoder checks lengths before allocating and names the
// sender in its FormatError.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "parallel/federated/secure_agg.h"

namespace kolo::parallel::fed::sa {

comm::Bytes encodeKeys(const PublicKeys& keys);
PublicKeys decodeKeys(const comm::Bytes& bytes, const std::string& from);

comm::Bytes encodeKeyList(const std::map<int, PublicKeys>& keys);
std::map<int, PublicKeys> decodeKeyList(const comm::Bytes& bytes, const std::string& from);

comm::Bytes encodeIds(const std::vector<int>& ids);
std::vector<int> decodeIds(const comm::Bytes& bytes, const std::string& from);

/// peer -> ciphertext (each at most 4 KiB).
comm::Bytes encodeBoxes(const std::map<int, comm::Bytes>& boxes);
std::map<int, comm::Bytes> decodeBoxes(const comm::Bytes& bytes, const std::string& from);

/// A masked input: round, client, count, then count u64 words.
comm::Bytes encodeMasked(int64_t round, int client, const std::vector<uint64_t>& words);
/// Throws Mismatch when the frame is for another round or client, or holds another number of
/// words than `length`.
std::vector<uint64_t> decodeMasked(const comm::Bytes& bytes, int64_t round, int client,
                                   size_t length);

/// owner -> share of 8 field elements.
comm::Bytes encodeReveal(const std::map<int, Share>& shares);
std::map<int, Share> decodeReveal(const comm::Bytes& bytes, const std::string& from);

}  // namespace kolo::parallel::fed::sa
