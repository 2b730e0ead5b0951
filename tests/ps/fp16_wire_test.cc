// The fp16 packing of --ps-compress fp16: each message is scaled by a power of two from its
// largest finite magnitude, so values beyond fp16's range (65504) and far below its smallest
// subnormal (6e-8) cross the wire with fp16's relative precision; NaN and infinity stay.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "parallel/ps/compress.h"

namespace kolo::parallel::ps::detail {
namespace {

std::vector<float> roundTrip(const std::vector<float>& in) {
  const int k = halfExponent(maxAbs(in.data(), in.size()));
  std::vector<uint16_t> wire(in.size());
  std::vector<float> out(in.size());
  packHalf(in.data(), wire.data(), in.size(), k);
  unpackHalf(wire.data(), out.data(), in.size(), k);
  return out;
}

TEST(Fp16Wire, ScalesEveryMessageIntoRange) {
  EXPECT_EQ(halfExponent(0.0f), 0);
  EXPECT_EQ(halfExponent(1.0f), 13);  // 1 * 2^13 in [2^13, 2^14)
  EXPECT_EQ(halfExponent(1e6f), -6);
  // Large values (an unscaled cast overflows to infinity) and tiny ones (it flushes to 0).
  for (const float top : {1e6f, 3.0e4f, 1.0f, 1e-6f, 1e-12f}) {
    std::vector<float> in;
    for (int i = 0; i < 37; ++i) in.push_back(top * std::pow(0.75f, static_cast<float>(i)) * (i % 2 ? -1 : 1));
    const std::vector<float> out = roundTrip(in);
    for (size_t i = 0; i < in.size(); ++i)
      EXPECT_NEAR(out[i], in[i], std::fabs(in[i]) * 4.9e-4) << "top " << top << " element " << i;
  }
}

TEST(Fp16Wire, KeepsNanAndInfinityWithoutSpoilingTheScale) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {1e-3f, std::nanf(""), -inf, 2e-3f};
  for (int i = 0; i < 20; ++i) in.push_back(1e-3f * static_cast<float>(i));
  EXPECT_EQ(maxAbs(in.data(), in.size()), 1e-3f * 19);
  const std::vector<float> out = roundTrip(in);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], -inf);
  EXPECT_NEAR(out[0], 1e-3f, 1e-3f * 4.9e-4);
  EXPECT_NEAR(out[3], 2e-3f, 2e-3f * 4.9e-4);
}

}  // namespace
}  // namespace kolo::parallel::ps::detail
