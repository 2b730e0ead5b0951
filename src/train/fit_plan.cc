// fit's plan: its options checked and the run's length (fit_plan.h), and the public
// stepsPerEpoch it rests on.
#include "train/fit_plan.h"

#include <algorithm>

#include "kolo/error.h"

namespace kolo::train {

int64_t stepsPerEpoch(int64_t datasetSize, int64_t batch, bool dropLast) {
  KOLO_REQUIRE(batch >= 1, "FitOptions::batch must be at least 1, got ", batch);
  const int64_t steps = dropLast ? datasetSize / batch : (datasetSize + batch - 1) / batch;
  KOLO_REQUIRE(steps > 0, "FitOptions::batch ", batch, " is larger than the training set's ",
               datasetSize, " samples: with FitOptions::dropLast no step is left");
  return steps;
}

namespace detail {

void checkRunOptions(const RunOptions& options, const char* type) {
  KOLO_REQUIRE(options.epochs >= 0, type, "::epochs must be at least 0, got ", options.epochs);
  KOLO_REQUIRE(options.steps >= 0, type, "::steps must be at least 0, got ", options.steps);
  KOLO_REQUIRE(options.checkpointEvery >= 0, type, "::checkpointEvery must be at least 0, got ",
               options.checkpointEvery);
  KOLO_REQUIRE(options.keepCheckpoints >= 1, type, "::keepCheckpoints must be at least 1, got ",
               options.keepCheckpoints);
}

FitPlan planFit(const FitOptions& options, int64_t trainSize) {
  checkRunOptions(options, "FitOptions");
  KOLO_REQUIRE(options.timingSkip >= 0, "FitOptions::timingSkip must be at least 0, got ",
               options.timingSkip);
  KOLO_REQUIRE(options.accumulate >= 1, "FitOptions::accumulate must be at least 1, got ",
               options.accumulate);
  KOLO_REQUIRE(options.metricsEvery >= 1, "FitOptions::metricsEvery must be at least 1, got ",
               options.metricsEvery);
  FitPlan plan;
  plan.stepsPerEpoch = stepsPerEpoch(trainSize, options.batch, options.dropLast);
  // `steps` is the total step count: it cuts `epochs` short, or alone sets the length.
  plan.totalSteps = std::max<int64_t>(options.epochs, 1) * plan.stepsPerEpoch;
  if (options.steps > 0)
    plan.totalSteps = options.epochs > 0 ? std::min(plan.totalSteps, options.steps) : options.steps;
  plan.epochs = (plan.totalSteps + plan.stepsPerEpoch - 1) / plan.stepsPerEpoch;
  return plan;
}

}  // namespace detail
}  // namespace kolo::train
