// Balancing for the synchronous loops (train::fit and the command line's elastic loop): each
// rank's share of the global batch, the re-plan of the split (parallel::Balancer) when due,
// and --debug-slow-rank's rank made slower on purpose (a benchmark hook of the command line).
#pragma once

#include <chrono>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/data.h"
#include "kolo/observe.h"
#include "kolo/parallel/balancer.h"
#include "kolo/parallel/reducer.h"

namespace kolo::train::detail {

/// --debug-slow-rank RANK:FACTOR: that rank sleeps (FACTOR - 1) times its last step's
/// compute before each step, as a host FACTOR times slower would take; its compute scales
/// with its share of the batch, so a balanced split shortens the sleep too.
class SlowRank {
 public:
  /// Slows this process when `slowRank` is `rank` and `factor` > 1; otherwise does nothing.
  SlowRank(int slowRank, int rank, double factor)
      : factor_(slowRank == rank && factor > 1.0 ? factor : 1.0) {}
  /// Sleeps before a step; returns the seconds slept.
  double sleepBeforeStep() const;
  /// Records the step's compute (its time, less the wait in the reducer's finalize).
  void computed(double seconds) { pending_ = (factor_ - 1.0) * seconds; }

 private:
  double factor_;
  double pending_ = 0.0;
};

/// A step's compute on this rank: `stepSeconds` less the time the reducer waited for the
/// other ranks in finalize (none without a reducer).
double computeSeconds(double stepSeconds, const parallel::Reducer* reducer);

/// Rows [offset, offset + count) of a global batch, in its order (this rank's share).
data::Batch shareOf(const data::Batch& globalBatch, int64_t offset, int64_t count);

/// When a re-plan is due, runs it over `comm` (collective); when the split changed, the
/// primary logs it and writes a {"event":"balance"} line to `metrics` (if any). Returns
/// whether the split changed. Throws what Balancer::replan throws.
bool replanWhenDue(parallel::Balancer& balancer, comm::Communicator& comm, int64_t step,
                   bool primary, observe::Logger& logger, observe::MetricsWriter* metrics);

}  // namespace kolo::train::detail
