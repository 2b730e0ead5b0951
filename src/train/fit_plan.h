// fit's plan of a run, the first of its pieces: the options checked in the library's words
// and the run's length (steps per epoch, total steps, epochs begun) over the training set,
// with the loader position of any step.
#pragma once

#include <cstdint>

#include "kolo/data.h"
#include "kolo/train/fit.h"

namespace kolo::train::detail {

struct FitPlan {
  int64_t stepsPerEpoch = 0;
  int64_t totalSteps = 0;  // `steps`, or every epoch's steps, whichever ends first
  int64_t epochs = 0;      // epochs begun
  /// Where the loader stands after `step` steps: at an epoch's end, the next epoch's start.
  data::LoaderState positionOf(int64_t step) const {
    return {step / stepsPerEpoch, step % stepsPerEpoch};
  }
};

/// Checks `options` (InvalidArgument naming the FitOptions member and the value) and plans a
/// run over `trainSize` samples.
FitPlan planFit(const FitOptions& options, int64_t trainSize);

/// The checks every trainer makes of the options it shares (RunOptions), each message naming
/// the caller's options type (`type`, e.g. "FitOptions"). Throws InvalidArgument.
void checkRunOptions(const RunOptions& options, const char* type);

}  // namespace kolo::train::detail
