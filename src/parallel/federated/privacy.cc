// The RDP accountant of DP-FedAvg: Rényi-DP of the sampled Gaussian mechanism at integer
// orders (Mironov, Talwar and Zhang 2019), composed over rounds and converted to
// (epsilon, delta)-DP (Mironov 2017, Proposition 3).
#include <cmath>
#include <limits>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"

namespace kolo::parallel::fed {
namespace {

constexpr int kMinOrder = 2;
constexpr int kMaxOrder = 256;

double logAddExp(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

}  // namespace

double sampledGaussianRdp(double q, double sigma, int alpha) {
  KOLO_REQUIRE(q >= 0.0 && q <= 1.0, "RDP: the sampling rate must lie in [0, 1], got ", q);
  KOLO_REQUIRE(alpha >= 2, "RDP: the order must be at least 2, got ", alpha);
  if (q == 0.0) return 0.0;
  if (!(sigma > 0.0)) return std::numeric_limits<double>::infinity();
  if (q == 1.0) return alpha / (2.0 * sigma * sigma);
  // log sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2-k) / (2 sigma^2)), term by term in logs.
  const double logQ = std::log(q), log1mQ = std::log1p(-q);
  double logSum = -std::numeric_limits<double>::infinity();
  for (int k = 0; k <= alpha; ++k) {
    const double logBinomial =
        std::lgamma(alpha + 1.0) - std::lgamma(k + 1.0) - std::lgamma(alpha - k + 1.0);
    const double term = logBinomial + (alpha - k) * log1mQ + k * logQ +
                        (static_cast<double>(k) * k - k) / (2.0 * sigma * sigma);
    logSum = logAddExp(logSum, term);
  }
  return logSum / (alpha - 1.0);
}

RdpAccountant::RdpAccountant(double q, double sigma) {
  for (int alpha = kMinOrder; alpha <= kMaxOrder; ++alpha)
    rdp_.push_back(sampledGaussianRdp(q, sigma, alpha));
}

double RdpAccountant::epsilon(double delta) const {
  KOLO_REQUIRE(delta > 0.0 && delta < 1.0, "RDP: delta must lie in (0, 1), got ", delta);
  if (rounds_ == 0) return 0.0;
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < rdp_.size(); ++i) {
    const double alpha = static_cast<double>(kMinOrder + static_cast<int>(i));
    best = std::min(best,
                    static_cast<double>(rounds_) * rdp_[i] + std::log(1.0 / delta) / (alpha - 1.0));
  }
  return best;
}

}  // namespace kolo::parallel::fed
