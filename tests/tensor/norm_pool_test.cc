// Batch norm's per-channel moments (kernels::channelMoments) against sums in f64: planes of
// an image's size (each read once, its squares about its own mean) and of a few values (two
// passes over the input), on ordinary values and on a large mean with a small spread, where
// squares about anything far from the mean would cancel.
#include "tensor/norm_pool.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kolo {
namespace {

struct MomentsCase {
  Shape shape;
  double mean, stddev;
};

class ChannelMomentsTest : public ::testing::TestWithParam<MomentsCase> {};

TEST_P(ChannelMomentsTest, MatchSumsInF64) {
  const MomentsCase k = GetParam();
  Generator gen(4);
  Tensor x = Tensor::randn(k.shape, gen, k.mean, k.stddev);
  const int64_t n = k.shape[0], c = k.shape[1], s = x.numel() / (n * c);
  const std::vector<double> v = x.toDoubleVector();
  const kernels::ChannelMoments m = kernels::channelMoments(x);
  ASSERT_EQ(m.count, n * s);
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0.0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) sum += v[(b * c + ch) * s + i];
    const double mean = sum / static_cast<double>(n * s);
    double m2 = 0.0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i)
        m2 += (v[(b * c + ch) * s + i] - mean) * (v[(b * c + ch) * s + i] - mean);
    EXPECT_NEAR(m.sum[ch], sum, 1e-6 * (1.0 + std::abs(sum))) << "channel " << ch;
    EXPECT_NEAR(m.m2[ch], m2, 1e-5 * m2) << "channel " << ch;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Planes, ChannelMomentsTest,
    ::testing::Values(MomentsCase{{8, 3, 7, 7}, 0.5, 2.0},      // one pass, odd plane
                      MomentsCase{{4, 2, 28, 28}, -1.0, 0.5},   // the resnet's first planes
                      MomentsCase{{6, 3, 7, 7}, 1000.0, 0.01},  // large mean, small spread
                      MomentsCase{{16, 5, 3, 3}, 0.0, 1.0},     // two passes
                      MomentsCase{{32, 4}, 1000.0, 0.01}));     // BatchNorm1d, two passes

}  // namespace
}  // namespace kolo
