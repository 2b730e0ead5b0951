// Balancer: the split of the global batch in proportion to each rank's measured speed, and
// the loss weight that keeps the averaged gradient the mean over the global batch.
#include "kolo/parallel/balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kolo/error.h"
#include "kolo/ops.h"

namespace kolo::parallel {

Balancer::Balancer(int64_t globalBatch, int rank, int ranks, BalancerOptions options)
    : globalBatch_(globalBatch), rank_(rank), options_(options) {
  KOLO_REQUIRE(ranks >= 1 && rank >= 0 && rank < ranks, "Balancer: rank ", rank, " of ", ranks);
  KOLO_REQUIRE(options_.replanEvery >= 1, "Balancer: re-plan every ", options_.replanEvery,
               " steps; it must be at least 1");
  KOLO_REQUIRE(options_.granularity >= 1 && globalBatch % options_.granularity == 0 &&
                   globalBatch / options_.granularity >= ranks,
               "Balancer: a global batch of ", globalBatch, " does not give each of ", ranks,
               " rank(s) a positive multiple of ", options_.granularity, " samples");
  const int64_t granules = globalBatch / options_.granularity;
  for (int r = 0; r < ranks; ++r)
    shares_.push_back((granules / ranks + (r < granules % ranks ? 1 : 0)) * options_.granularity);
}

int64_t Balancer::offset(int rank) const {
  KOLO_REQUIRE(rank >= 0 && rank < ranks(), "Balancer::offset: rank ", rank, " of ", ranks());
  return std::accumulate(shares_.begin(), shares_.begin() + rank, int64_t{0});
}

double Balancer::lossWeight() const {
  return static_cast<double>(share() * ranks()) / static_cast<double>(globalBatch_);
}

LossFn Balancer::weightedLoss(LossFn loss) const {
  return [this, loss = std::move(loss)](nn::Module& model, const Tensor& inputs, const Tensor& labels) {
    Tensor mean = loss ? loss(model, inputs, labels) : crossEntropy(model.forward(inputs), labels);
    const double weight = lossWeight();
    return weight == 1.0 ? mean : mean * weight;
  };
}

void Balancer::record(double busySeconds) {
  if (!warm_) {
    warm_ = true;
    return;
  }
  busySeconds_ += busySeconds;
  busySamples_ += share();
  ++recorded_;
}

bool Balancer::replan(comm::Communicator& comm) {
  KOLO_REQUIRE(comm.size() == ranks() && comm.rank() == rank_, "Balancer::replan: rank ",
               comm.rank(), " of ", comm.size(), " but the balancer is rank ", rank_, " of ",
               ranks());
  // Each rank fills its own slot; the sum gives every rank every slot.
  std::vector<double> mine(ranks(), 0.0), all(ranks(), 0.0);
  mine[rank_] = busySamples_ > 0 ? busySeconds_ / static_cast<double>(busySamples_) : 0.0;
  comm.allreduce(mine.data(), all.data(), all.size(), DType::F64, comm::ReduceOp::Sum);
  recorded_ = 0;
  busySeconds_ = 0.0;
  busySamples_ = 0;
  if (std::any_of(all.begin(), all.end(), [](double s) { return !(s > 0.0) || !std::isfinite(s); }))
    return false;  // a rank has no measurement yet
  // The estimate is the mean of this window's and the previous estimate (an exponential
  // average): one noisy window (a preempted rank) moves the split half as far.
  if (secondsPerSample_.size() == all.size())
    for (size_t r = 0; r < all.size(); ++r) all[r] = 0.5 * (all[r] + secondsPerSample_[r]);
  secondsPerSample_ = all;
  std::vector<double> speeds;
  for (double s : all) speeds.push_back(1.0 / s);
  std::vector<int64_t> proposed = proportionalShares(globalBatch_, speeds, options_.granularity);
  if (proposed == shares_ ||
      predictedStepSeconds(proposed, all) >
          (1.0 - options_.hysteresis) * predictedStepSeconds(shares_, all))
    return false;
  shares_ = std::move(proposed);
  return true;
}

std::vector<int64_t> Balancer::proportionalShares(int64_t globalBatch, const std::vector<double>& speeds,
                                                  int64_t granularity) {
  const int n = static_cast<int>(speeds.size());
  KOLO_REQUIRE(n >= 1 && granularity >= 1 && globalBatch % granularity == 0 &&
                   globalBatch / granularity >= n,
               "Balancer::proportionalShares: a batch of ", globalBatch, " cannot give ", n,
               " rank(s) a positive multiple of ", granularity);
  for (double s : speeds)
    KOLO_REQUIRE(s > 0.0 && std::isfinite(s), "Balancer::proportionalShares: speed ", s,
                 " is not a positive number");
  const int64_t granules = globalBatch / granularity;
  const double total = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  std::vector<double> ideal(n);
  std::vector<int64_t> shares(n);
  int64_t given = 0;
  for (int r = 0; r < n; ++r) {
    ideal[r] = static_cast<double>(granules) * speeds[r] / total;
    shares[r] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(ideal[r])));
    given += shares[r];
  }
  // Largest remainder first; a rank raised to one granule may leave too many given, taken
  // back from the ranks furthest above their ideal.
  while (given < granules) {
    int best = 0;
    for (int r = 1; r < n; ++r)
      if (ideal[r] - static_cast<double>(shares[r]) > ideal[best] - static_cast<double>(shares[best])) best = r;
    ++shares[best];
    ++given;
  }
  while (given > granules) {
    int best = -1;
    for (int r = 0; r < n; ++r)
      if (shares[r] > 1 && (best < 0 || static_cast<double>(shares[r]) - ideal[r] >
                                            static_cast<double>(shares[best]) - ideal[best]))
        best = r;
    --shares[best];
    --given;
  }
  for (int64_t& s : shares) s *= granularity;
  return shares;
}

double Balancer::predictedStepSeconds(const std::vector<int64_t>& shares,
                                      const std::vector<double>& secondsPerSample) {
  KOLO_REQUIRE(shares.size() == secondsPerSample.size(), "Balancer::predictedStepSeconds: ",
               shares.size(), " shares but ", secondsPerSample.size(), " timings");
  double longest = 0.0;
  for (size_t r = 0; r < shares.size(); ++r)
    longest = std::max(longest, static_cast<double>(shares[r]) * secondsPerSample[r]);
  return longest;
}

}  // namespace kolo::parallel
