// Secure aggregation: Shamir sharing over GF(2^61 - 1); the server's unmasked sum equals the
// plain sum of the quantised inputs bit for bit, with and without 30% of the clients
// dropping after the key exchange; a masked input is uncorrelated with the input it hides;
// too few shares, or tampered ones, are refused.
#include "parallel/federated/secure_agg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kolo/error.h"
#include "kolo/tensor.h"
#include "parallel/federated/sa_wire.h"

namespace kolo::parallel::fed::sa {
namespace {

std::vector<float> randomUpdate(size_t n, uint64_t seed) {
  Generator generator(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(0.01 * generator.normal());
  return v;
}

TEST(FederatedShamir, AnyThresholdSubsetRebuildsTheSecret) {
  const std::vector<uint64_t> secret = {0, 1, 42, kFieldPrime - 1, 0xffffffffu};
  const std::vector<Share> shares = shamirSplit(secret, 3, {1, 2, 3, 4, 5, 9});
  for (size_t a = 0; a < shares.size(); ++a)
    for (size_t b = a + 1; b < shares.size(); ++b)
      for (size_t c = b + 1; c < shares.size(); ++c)
        EXPECT_EQ(shamirCombine({shares[a], shares[b], shares[c]}, 3), secret);
  // Two shares of a degree-2 polynomial say nothing: interpolating them gives another value.
  EXPECT_NE(shamirCombine({shares[0], shares[1]}, 2), secret);
  EXPECT_THROW(shamirCombine({shares[0], shares[1]}, 3), InvalidArgument);
  EXPECT_THROW(shamirCombine({shares[0], shares[0], shares[1]}, 3), InvalidArgument);
  EXPECT_THROW(shamirSplit(secret, 3, {1, 1, 2}), InvalidArgument);
  Key key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(255 - 7 * i);
  EXPECT_EQ(fieldToKey(keyToField(key)), key);
}

TEST(FederatedQuantize, RoundTripsAndRefusesOutOfRange) {
  const std::vector<float> v = {0.5f, -0.25f, 1e-3f, -3.0f};
  const std::vector<double> back = dequantize(quantize(v, 3));
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(back[i], 3.0 * v[i], std::ldexp(1.0, -kScaleBits));
  EXPECT_EQ(quantize(v, 3).back(), 3u);
  EXPECT_THROW(quantize({NAN}, 1), InvalidArgument);
  EXPECT_THROW(quantize({1e9f}, 1), InvalidArgument);
}

struct Round {
  std::map<int, std::unique_ptr<Client>> clients;
  std::map<int, PublicKeys> u1;
  std::map<int, std::map<int, comm::Bytes>> boxes;  // sender -> recipient -> box
  std::map<int, std::vector<uint64_t>> inputs;
};

// Runs the four steps in memory for `n` clients of which `dropped` leave after sharing keys;
// returns the server's sum and fills `plain` with the survivors' plain sum.
std::vector<uint64_t> runRound(int n, int threshold, const std::set<int>& dropped, size_t length,
                               std::vector<uint64_t>& plain,
                               std::map<int, std::vector<uint64_t>>* maskedOut = nullptr) {
  const int64_t round = 5;
  Round r;
  for (int c = 0; c < n; ++c) {
    const int id = 3 * c + 1;  // ids need not be dense
    r.clients[id] = std::make_unique<Client>(round, id, threshold);
    r.u1[id] = r.clients[id]->publicKeys();
    r.inputs[id] = quantize(randomUpdate(length, id), 10 + c);
  }
  std::vector<int> u2;
  for (auto& [id, client] : r.clients) {
    r.boxes[id] = client->shareKeys(r.u1);
    u2.push_back(id);
  }
  std::map<int, std::vector<uint64_t>> masked;
  std::vector<int> u3;
  plain.assign(length + 1, 0);
  for (int id : u2) {
    if (dropped.count(id)) continue;
    masked[id] = r.clients[id]->maskInput(r.inputs[id], u2);
    u3.push_back(id);
    for (size_t i = 0; i <= length; ++i) plain[i] += r.inputs[id][i];
  }
  std::map<int, std::map<int, Share>> revealed;
  for (int id : u3) {
    std::map<int, comm::Bytes> inbox;
    for (int sender : u2) inbox[sender] = r.boxes[sender][id];
    revealed[id] = r.clients[id]->unmask(u2, u3, inbox);
  }
  if (maskedOut) *maskedOut = masked;
  return unmaskSum(round, masked, r.u1, u2, revealed, threshold);
}

TEST(FederatedSecureAgg, SumEqualsThePlainQuantisedSumBitForBit) {
  std::vector<uint64_t> plain;
  EXPECT_EQ(runRound(10, 6, {}, 1000, plain), plain);
}

TEST(FederatedSecureAgg, ThirtyPercentDropAfterKeyExchangeAndTheSumIsRecovered) {
  std::vector<uint64_t> plain;
  const std::vector<uint64_t> sum = runRound(10, 6, {4, 13, 25}, 1000, plain);  // 3 of 10
  EXPECT_EQ(sum, plain);
  EXPECT_EQ(sum.back(), 10u + 12 + 13 + 15 + 16 + 17 + 19);  // the survivors' weights
}

TEST(FederatedSecureAgg, TooManyDropsCannotBeUnmasked) {
  std::vector<uint64_t> plain;
  EXPECT_THROW(runRound(10, 6, {1, 4, 7, 10, 13}, 10, plain), Error);  // 5 survivors < 6
}

TEST(FederatedSecureAgg, MaskedInputIsUncorrelatedWithTheInput) {
  std::vector<uint64_t> plain;
  std::map<int, std::vector<uint64_t>> masked;
  const size_t n = 50000;
  runRound(4, 3, {}, n, plain, &masked);
  const std::vector<uint64_t> input = quantize(randomUpdate(n, 1), 10);  // client id 1
  const std::vector<uint64_t>& seen = masked.at(1);
  // Pearson correlation of the input (as signed fixed point) with what the server sees
  // (as uniform words): about N(0, 1/n) for independent values.
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(static_cast<int64_t>(input[i]));
    const double y = static_cast<double>(seen[i]) / 18446744073709551616.0;
    sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
  }
  const double cov = sxy / n - sx / n * sy / n;
  const double r = cov / std::sqrt((sxx / n - sx / n * sx / n) * (syy / n - sy / n * sy / n));
  EXPECT_LT(std::fabs(r), 0.03);  // 6.7 standard deviations
  // The words are uniform: their mean is 1/2 (in units of 2^64) within a few 1/sqrt(12 n).
  EXPECT_NEAR(sy / n, 0.5, 0.01);
}

TEST(FederatedSecureAgg, TamperedSharesDoNotAuthenticate) {
  Client a(1, 0, 2), b(1, 1, 2);
  const std::map<int, PublicKeys> u1 = {{0, a.publicKeys()}, {1, b.publicKeys()}};
  auto fromA = a.shareKeys(u1);
  auto fromB = b.shareKeys(u1);
  fromA[1][20] ^= 1;
  try {
    b.unmask({0, 1}, {0, 1}, {{0, fromA[1]}, {1, fromB[1]}});
    ADD_FAILURE() << "accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("from client 0 to client 1"), std::string::npos)
        << e.what();
  }
}

TEST(FederatedSecureAgg, BadMaskedInputsAreRefusedAndNamed) {
  const comm::Bytes frame = encodeMasked(4, 7, {1, 2, 3});
  EXPECT_EQ(decodeMasked(frame, 4, 7, 3), (std::vector<uint64_t>{1, 2, 3}));
  auto refused = [&](int64_t round, int client, size_t length, const std::string& words) {
    try {
      decodeMasked(frame, round, client, length);
      ADD_FAILURE() << "accepted";
    } catch (const Mismatch& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(5, 7, 3, "client 7 sent a masked input for round 4 in round 5 (stale)");
  refused(4, 7, 4, "client 7 sent a masked input of 3 words, the model needs 4");
  refused(4, 8, 3, "client 8 sent a masked input labelled client 7");
  comm::Bytes cut(frame.begin(), frame.end() - 3);
  EXPECT_THROW(decodeMasked(cut, 4, 7, 3), FormatError);
  comm::Bytes boxes = encodeBoxes({{1, comm::Bytes(10, 0)}});
  boxes[8] = 0xff;  // the box announces more bytes than the frame holds
  EXPECT_THROW(decodeBoxes(boxes, "client 1"), FormatError);
}

}  // namespace
}  // namespace kolo::parallel::fed::sa
