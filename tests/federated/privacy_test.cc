// The RDP accountant: the sampled Gaussian mechanism's bound against its closed forms
// (q = 1: the Gaussian mechanism, alpha / (2 sigma^2); alpha = 2: log(1 + q^2 (e^(1/sigma^2) - 1)))
// and the conversion to (epsilon, delta).
#include <gtest/gtest.h>

#include <cmath>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"

namespace kolo::parallel::fed {
namespace {

TEST(FederatedPrivacy, SampledGaussianMatchesClosedForms) {
  for (double sigma : {0.5, 1.0, 4.0}) {
    for (int alpha : {2, 3, 10, 64})
      EXPECT_DOUBLE_EQ(sampledGaussianRdp(1.0, sigma, alpha), alpha / (2 * sigma * sigma));
    for (double q : {0.001, 0.01, 0.1, 0.5, 0.99}) {
      EXPECT_NEAR(sampledGaussianRdp(q, sigma, 2),
                  std::log1p(q * q * std::expm1(1 / (sigma * sigma))), 1e-12);
      // Sampling only helps: below the unsampled mechanism at every order.
      for (int alpha : {3, 8, 32})
        EXPECT_LT(sampledGaussianRdp(q, sigma, alpha), alpha / (2 * sigma * sigma));
    }
  }
  EXPECT_EQ(sampledGaussianRdp(0.0, 1.0, 5), 0.0);
  EXPECT_TRUE(std::isinf(sampledGaussianRdp(0.1, 0.0, 5)));
  EXPECT_THROW(sampledGaussianRdp(1.5, 1.0, 2), InvalidArgument);
  EXPECT_THROW(sampledGaussianRdp(0.1, 1.0, 1), InvalidArgument);
}

TEST(FederatedPrivacy, EpsilonGrowsWithRoundsAndShrinksWithNoise) {
  RdpAccountant low(0.1, 0.8), high(0.1, 1.5);
  EXPECT_EQ(low.epsilon(1e-5), 0.0);
  double previous = 0.0;
  for (int r = 0; r < 5; ++r) {
    low.step(10);
    high.step(10);
    const double eps = low.epsilon(1e-5);
    EXPECT_GT(eps, previous);
    EXPECT_LT(high.epsilon(1e-5), eps);
    EXPECT_GT(low.epsilon(1e-3), 0.0);
    EXPECT_LT(low.epsilon(1e-3), eps);  // a larger delta buys a smaller epsilon
    previous = eps;
  }
  // q = 1, one round: the Gaussian mechanism's RDP converted at the best integer order.
  RdpAccountant gaussian(1.0, 2.0);
  gaussian.step();
  double best = INFINITY;
  for (int alpha = 2; alpha <= 256; ++alpha)
    best = std::min(best, alpha / 8.0 + std::log(1e5) / (alpha - 1));
  EXPECT_DOUBLE_EQ(gaussian.epsilon(1e-5), best);
}

}  // namespace
}  // namespace kolo::parallel::fed
