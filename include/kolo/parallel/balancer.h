// Load balancing for synchronous data parallelism: every step waits for the slowest rank,
// so the global batch is split over the ranks in proportion to their measured speed, and
// each rank's mean loss is weighted by its share of the global batch so that the averaged
// gradient is still the mean over the whole global batch (the update of one device fed the
// same global batch). See docs/elastic.md ("Load balancing").
#pragma once

#include <cstdint>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/parallel/strategy.h"

namespace kolo::parallel {

struct BalancerOptions {
  /// Steps between re-plans; each re-plan is one all-reduce of a double per rank.
  int64_t replanEvery = 10;
  /// A new split is taken only when it is predicted to shorten the step by more than this
  /// fraction (hysteresis: timing noise does not move samples back and forth).
  double hysteresis = 0.05;
  /// Every share is a positive multiple of this (the replicas of a rank).
  int64_t granularity = 1;
};

/// The split of a global batch over the ranks of one communicator, and the measurements
/// that move it. Rank r takes the contiguous positions [offset(r), offset(r) + share(r)) of
/// every global batch; its loss is multiplied by lossWeight() (share · ranks / batch): the
/// all-reduce averages over the ranks, so the gradient is Σ share·mean / batch, the mean
/// over the global batch whatever the split. Starts with the even split (the first
/// batch % ranks ranks take one granule more), which gives every rank the weight 1 when the
/// batch divides evenly: then the math is plain data parallelism's. Not thread-safe.
class Balancer {
 public:
  /// Throws InvalidArgument for a rank outside 0..ranks-1, a batch that is not a multiple
  /// of granularity or has fewer granules than ranks, or replanEvery < 1.
  Balancer(int64_t globalBatch, int rank, int ranks, BalancerOptions options = {});

  int64_t globalBatch() const { return globalBatch_; }
  int rank() const { return rank_; }
  int ranks() const { return static_cast<int>(shares_.size()); }
  /// Samples of each rank per global batch (they sum to globalBatch()).
  const std::vector<int64_t>& shares() const { return shares_; }
  int64_t share(int rank) const { return shares_.at(rank); }
  int64_t share() const { return shares_[rank_]; }
  /// The first position of `rank`'s share in the global batch.
  int64_t offset(int rank) const;
  int64_t offset() const { return offset(rank_); }
  /// Factor on this rank's mean loss: share() · ranks() / globalBatch().
  double lossWeight() const;
  /// `loss` (default: cross-entropy of the model's output) times lossWeight() at each call:
  /// give it to makeStrategy. The Balancer must outlive the strategy.
  LossFn weightedLoss(LossFn loss = nullptr) const;

  /// Records how long this rank was busy with its share of one step: its forward and
  /// backward, not the time it waited for the others. The first step after construction is
  /// left out (rings and buffers are made then).
  void record(double busySeconds);
  /// True once replanEvery steps were recorded since the last re-plan.
  bool replanDue() const { return recorded_ >= options_.replanEvery; }
  /// Collective over `comm` (this balancer's rank of as many ranks): exchanges each rank's
  /// seconds per sample since the last re-plan, averages them with the previous estimate
  /// (half each), and takes the split proportional to the estimated speed
  /// (proportionalShares) when it is predicted to be faster by more than the hysteresis.
  /// Starts a new measuring window either way. Returns true when the split changed; every
  /// rank decides the same from the same exchanged numbers. Throws what the all-reduce
  /// throws (PeerError, Timeout) and InvalidArgument for a communicator of another size.
  bool replan(comm::Communicator& comm);
  /// Each rank's estimated seconds per sample after the last re-plan (empty before one).
  const std::vector<double>& secondsPerSample() const { return secondsPerSample_; }

  /// The split of `globalBatch` proportional to `speeds` (samples per second, > 0): each
  /// share a positive multiple of `granularity`, summing to globalBatch, rounded by largest
  /// remainder (ties to the lower rank).
  static std::vector<int64_t> proportionalShares(int64_t globalBatch, const std::vector<double>& speeds,
                                                 int64_t granularity = 1);
  /// The step time a split predicts: the longest share · seconds-per-sample.
  static double predictedStepSeconds(const std::vector<int64_t>& shares,
                                     const std::vector<double>& secondsPerSample);

 private:
  int64_t globalBatch_;
  int rank_;
  BalancerOptions options_;
  std::vector<int64_t> shares_;
  std::vector<double> secondsPerSample_;
  bool warm_ = false;  // the first step was seen (and left out)
  int64_t recorded_ = 0;
  double busySeconds_ = 0.0;
  int64_t busySamples_ = 0;
};

}  // namespace kolo::parallel
