// The two pipeline schedules as lists of actions per stage, and their names.
#include <algorithm>

#include "kolo/error.h"
#include "kolo/parallel/pipeline.h"

namespace kolo::parallel {

const char* pipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::GPipe ? "gpipe" : "1f1b";
}

PipelineSchedule parsePipelineSchedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "1f1b") return PipelineSchedule::OneFOneB;
  KOLO_THROW(InvalidArgument, "pipeline schedule '", name, "' is not accepted: use gpipe or 1f1b");
}

std::vector<PipelineAction> pipelineActions(PipelineSchedule schedule, int stages, int stage,
                                            int microBatches) {
  KOLO_REQUIRE(stages >= 1 && microBatches >= 1, "pipeline: stages (", stages, ") and micro-batches (",
               microBatches, ") must be at least 1");
  KOLO_REQUIRE(stage >= 0 && stage < stages, "pipeline: stage ", stage, " outside [0, ", stages, ")");
  std::vector<PipelineAction> actions;
  actions.reserve(static_cast<size_t>(2 * microBatches));
  // GPipe is 1F1B with a warm-up as long as the batch: every forward before any backward.
  const int warmup = schedule == PipelineSchedule::GPipe ? microBatches
                                                         : std::min(stages - stage - 1, microBatches);
  int nextForward = 0, nextBackward = 0;
  for (; nextForward < warmup; ++nextForward) actions.push_back({true, nextForward});
  // Steady state: the forward of a new micro-batch, then the backward of the oldest, so a
  // stage never holds more than warmup + 1 <= P - stage micro-batches.
  while (nextForward < microBatches) {
    actions.push_back({true, nextForward++});
    actions.push_back({false, nextBackward++});
  }
  while (nextBackward < microBatches) actions.push_back({false, nextBackward++});
  return actions;
}

}  // namespace kolo::parallel
