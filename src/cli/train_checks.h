// The test-only injections that prove `kolo train`'s numeric checks: --debug-nan-at (a NaN
// written into a module's output or gradient, which --detect-anomaly's detector must name)
// and --debug-perturb (one weight changed on one rank, which --check-sync must name). The
// checks themselves run in train::fit (FitOptions::anomalyDetector, checkSyncEvery).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cli/train_loop.h"
#include "kolo/numerics.h"

namespace kolo::cli {

class TrainChecks {
 public:
  /// Parses the injections (InvalidArgument naming the flag and what it accepts) and builds
  /// the anomaly detector on `model` when --detect-anomaly or --debug-nan-at asks for it.
  /// `rank`: this process's rank. `parameterGradients`: whether the detector may read
  /// parameter gradients as they become final (not while a reducer all-reduces buckets in
  /// place during backward).
  TrainChecks(const TrainConfig& config, nn::Module& model, int rank, bool parameterGradients);
  ~TrainChecks();
  /// The detector for FitOptions::anomalyDetector (null when off).
  std::shared_ptr<observe::AnomalyDetector> detector() const { return detector_; }
  /// Before step `step` (0-based): applies --debug-perturb.
  void beforeStep(int64_t step);

 private:
  nn::Module& model_;
  int rank_;
  std::shared_ptr<observe::AnomalyDetector> detector_;
  int64_t perturbStep_ = -1;
  int perturbRank_ = 0;
  std::string perturbTensor_;
};

}  // namespace kolo::cli
