// What stops a fit before its last step, one of fit's pieces: the checks after each step (a
// loss that is not finite, a NaN the anomaly detector found, replicas out of sync), and a
// SIGTERM, which lets the step under way end and be checkpointed first.
#pragma once

#include <cstdint>

#include "kolo/comm/communicator.h"
#include "kolo/train/engine.h"
#include "kolo/train/fit.h"

namespace kolo::train::detail {

/// The checks after step `step` (0-based) that end a run, in order: options.anomalyDetector's
/// finding (agreed over `comm`'s ranks), the replicas' weights every checkSyncEvery steps
/// (ReplicaMismatch), and a loss that is not finite (DivergedError naming the step and lr).
/// Collective where the first two are on.
void checkStep(const FitOptions& options, Engine& engine, comm::Communicator* comm, int64_t step,
               double loss, double lr);

/// While fit runs with checkpoints, SIGTERM only asks it to save and stop at a step's end
/// (where SIGTERM had its default action); the previous action comes back when the last fit
/// of the process ends (ranks as threads of one process share the handler).
class TerminateRequests {
 public:
  explicit TerminateRequests(bool wanted);
  ~TerminateRequests();
  TerminateRequests(const TerminateRequests&) = delete;
  TerminateRequests& operator=(const TerminateRequests&) = delete;

  /// Whether any rank got SIGTERM since fit started, agreed over `comm`: collective on every
  /// rank whenever checkpoints are on (whether or not this process could take the signal).
  bool agreed(comm::Communicator* comm) const;
  /// Ends the process by SIGTERM, its default action.
  [[noreturn]] void terminate();

 private:
  bool wanted_;
};

}  // namespace kolo::train::detail
