// Shamir secret sharing over the prime field GF(2^61 - 1) and the fixed-point encoding of
// secure aggregation (secure_agg.h). Field arithmetic, not a cipher: the randomness of the
// polynomials comes from libsodium's randombytes.
#include <sodium.h>

#include <cmath>
#include <set>

#include "kolo/error.h"
#include "parallel/federated/secure_agg.h"

namespace kolo::parallel::fed::sa {
namespace {

uint64_t reduce(unsigned __int128 x) {
  // 2^61 = 1 (mod p): fold the high bits onto the low ones.
  uint64_t r = static_cast<uint64_t>(x & kFieldPrime) + static_cast<uint64_t>(x >> 61);
  r = (r & kFieldPrime) + (r >> 61);
  return r >= kFieldPrime ? r - kFieldPrime : r;
}
uint64_t mul(uint64_t a, uint64_t b) { return reduce(static_cast<unsigned __int128>(a) * b); }
uint64_t add(uint64_t a, uint64_t b) { return reduce(static_cast<unsigned __int128>(a) + b); }
uint64_t sub(uint64_t a, uint64_t b) { return add(a, kFieldPrime - b); }
uint64_t power(uint64_t base, uint64_t exponent) {
  uint64_t result = 1;
  for (; exponent; exponent >>= 1, base = mul(base, base))
    if (exponent & 1) result = mul(result, base);
  return result;
}
uint64_t inverse(uint64_t a) { return power(a, kFieldPrime - 2); }  // Fermat

uint64_t randomElement() {
  for (;;) {
    uint64_t v = 0;
    randombytes_buf(&v, sizeof v);
    v &= kFieldPrime;  // 61 bits; reject the one value equal to p
    if (v < kFieldPrime) return v;
  }
}

}  // namespace

std::vector<Share> shamirSplit(const std::vector<uint64_t>& secret, int threshold,
                               const std::vector<uint32_t>& xs) {
  KOLO_REQUIRE(sodium_init() >= 0, "libsodium failed to initialise");
  KOLO_REQUIRE(threshold >= 1 && static_cast<size_t>(threshold) <= xs.size(), "Shamir: threshold ",
               threshold, " needs between 1 and ", xs.size(), " shares");
  std::set<uint32_t> seen;
  for (uint32_t x : xs)
    KOLO_REQUIRE(x != 0 && seen.insert(x).second, "Shamir: point ", x, " is zero or repeated");
  std::vector<Share> shares(xs.size());
  for (size_t j = 0; j < xs.size(); ++j) {
    shares[j].x = xs[j];
    shares[j].y.resize(secret.size());
  }
  std::vector<uint64_t> coefficients(static_cast<size_t>(threshold));
  for (size_t e = 0; e < secret.size(); ++e) {
    KOLO_REQUIRE(secret[e] < kFieldPrime, "Shamir: secret element ", e, " is outside the field");
    coefficients[0] = secret[e];
    for (int k = 1; k < threshold; ++k) coefficients[k] = randomElement();
    for (size_t j = 0; j < xs.size(); ++j) {
      uint64_t value = 0;  // Horner
      for (int k = threshold - 1; k >= 0; --k) value = add(mul(value, xs[j]), coefficients[k]);
      shares[j].y[e] = value;
    }
  }
  sodium_memzero(coefficients.data(), coefficients.size() * sizeof(uint64_t));
  return shares;
}

std::vector<uint64_t> shamirCombine(const std::vector<Share>& shares, int threshold) {
  KOLO_REQUIRE(threshold >= 1 && shares.size() >= static_cast<size_t>(threshold),
               "Shamir: ", shares.size(), " shares cannot rebuild a secret of threshold ",
               threshold);
  const size_t t = static_cast<size_t>(threshold);
  const size_t length = shares[0].y.size();
  std::set<uint32_t> seen;
  for (size_t j = 0; j < t; ++j) {
    KOLO_REQUIRE(shares[j].x != 0 && seen.insert(shares[j].x).second, "Shamir: point ", shares[j].x,
                 " is zero or repeated");
    KOLO_REQUIRE(shares[j].y.size() == length, "Shamir: shares of different lengths (",
                 shares[j].y.size(), " and ", length, ")");
  }
  std::vector<uint64_t> secret(length, 0);
  for (size_t j = 0; j < t; ++j) {
    // Lagrange basis at 0: prod_{m != j} x_m / (x_m - x_j).
    uint64_t numerator = 1, denominator = 1;
    for (size_t m = 0; m < t; ++m) {
      if (m == j) continue;
      numerator = mul(numerator, shares[m].x);
      denominator = mul(denominator, sub(shares[m].x, shares[j].x));
    }
    const uint64_t basis = mul(numerator, inverse(denominator));
    for (size_t e = 0; e < length; ++e)
      secret[e] = add(secret[e], mul(shares[j].y[e] % kFieldPrime, basis));
  }
  return secret;
}

std::vector<uint64_t> keyToField(const Key& key) {
  std::vector<uint64_t> values(8);
  for (size_t i = 0; i < 8; ++i)
    values[i] = uint64_t{key[4 * i]} | uint64_t{key[4 * i + 1]} << 8 |
                uint64_t{key[4 * i + 2]} << 16 | uint64_t{key[4 * i + 3]} << 24;
  return values;
}

Key fieldToKey(const std::vector<uint64_t>& values) {
  KOLO_REQUIRE(values.size() == 8, "Shamir: a key has 8 elements, got ", values.size());
  Key key{};
  for (size_t i = 0; i < 8; ++i) {
    KOLO_REQUIRE(values[i] <= 0xffffffffu, "Shamir: element ", i,
                 " of a rebuilt key exceeds 32 bits");
    for (size_t b = 0; b < 4; ++b) key[4 * i + b] = static_cast<uint8_t>(values[i] >> (8 * b));
  }
  return key;
}

std::vector<uint64_t> quantize(const std::vector<float>& values, int64_t weight) {
  KOLO_REQUIRE(weight >= 1, "secure aggregation: the weight must be at least 1, got ", weight);
  std::vector<uint64_t> out(values.size() + 1);
  const double scale = std::ldexp(static_cast<double>(weight), kScaleBits);
  const double limit = std::ldexp(1.0, 28 + kScaleBits);
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = std::nearbyint(static_cast<double>(values[i]) * scale);
    KOLO_REQUIRE(std::isfinite(v) && std::fabs(v) < limit, "secure aggregation: element ", i, " (",
                 values[i], " x weight ", weight, ") is not finite or outside +-2^28");
    out[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
  }
  out.back() = static_cast<uint64_t>(weight);
  return out;
}

std::vector<double> dequantize(const std::vector<uint64_t>& sum) {
  KOLO_REQUIRE(!sum.empty(), "secure aggregation: an empty sum");
  std::vector<double> out(sum.size() - 1);
  for (size_t i = 0; i + 1 < sum.size(); ++i)
    out[i] = std::ldexp(static_cast<double>(static_cast<int64_t>(sum[i])), -kScaleBits);
  return out;
}

}  // namespace kolo::parallel::fed::sa
