// The numeric checks of `kolo train`: --detect-anomaly (an observe::AnomalyDetector on the
// trained model, agreed over the ranks after every step), --check-sync N (the ranks' weight
// hashes compared every N steps), and the two test-only injections that prove them
// (--debug-nan-at, --debug-perturb).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cli/train_loop.h"
#include "kolo/numerics.h"

namespace kolo::cli {

class TrainChecks {
 public:
  /// Parses the injections (InvalidArgument naming the flag and what it accepts) and
  /// installs the detector on `model` when asked. `comm` is null for one-process
  /// strategies; --check-sync needs it (InvalidArgument otherwise). `parameterGradients`:
  /// whether the detector may read parameter gradients as they become final (not while a
  /// reducer all-reduces buckets in place during backward).
  TrainChecks(const TrainConfig& config, nn::Module& model, comm::Communicator* comm,
              bool parameterGradients);
  ~TrainChecks();
  /// Before step `step` (0-based): starts the detector's step; applies --debug-perturb.
  void beforeStep(int64_t step);
  /// After step `step` was taken (`step` + 1 steps done): --detect-anomaly throws
  /// DivergedError naming rank, step and module (on every rank alike); --check-sync throws
  /// ReplicaMismatch naming the ranks and the first tensor when it is due. Collective when
  /// a check is on under several ranks.
  void afterStep(int64_t step);

 private:
  const TrainConfig& config_;
  nn::Module& model_;
  comm::Communicator* comm_;
  std::unique_ptr<observe::AnomalyDetector> detector_;
  int64_t perturbStep_ = -1;
  int perturbRank_ = 0;
  std::string perturbTensor_;
};

}  // namespace kolo::cli
