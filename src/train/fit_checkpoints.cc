// fit's checkpoints and resume (fit_checkpoints.h).
#include "train/fit_checkpoints.h"

#include "kolo/trace.h"
#include "train/resume.h"

namespace kolo::train::detail {

FitCheckpoints::FitCheckpoints(Engine& engine, const FitOptions& options, const FitPlan& plan,
                               std::shared_ptr<comm::Communicator> comm, observe::Logger& logger)
    : engine_(engine),
      options_(options),
      plan_(plan),
      checkpoints_{.directory = options.checkpointDir,
                   .keep = options.keepCheckpoints,
                   .communicator = std::move(comm),
                   .identity = identityOf(options),
                   .warn = [&logger](const std::string& line) { logger.warn(line); }},
      logger_(logger) {}

std::optional<Position> FitCheckpoints::resume(bool primary) {
  const std::string directory = resumeDirectory(options_.resumeDir, options_.checkpointDir);
  if (directory.empty()) return std::nullopt;
  CheckpointOptions from = checkpoints_;
  from.directory = directory;
  const Position position = loadFrom({&engine_}, from, "FitOptions::resumeDir");
  if (primary)
    logger_.info(options_.resumeDir.empty() ? "requeued Slurm job: resuming from its checkpoints" : "resuming",
                 {{"checkpoint", position.path}, {"step", position.step}});
  return position;
}

bool FitCheckpoints::due(int64_t steps) const {
  return options_.checkpointEvery > 0 && steps % options_.checkpointEvery == 0;
}

void FitCheckpoints::save(int64_t steps, MetricsLog& metrics, bool primary) {
  if (options_.checkpointDir.empty()) return;
  trace::Scope span("checkpoint", "checkpoint");
  span.index(steps);
  // At an epoch's end the position is the next epoch's start, as every trainer records it.
  const std::string path =
      train::save({&engine_}, {.step = steps, .loader = plan_.positionOf(steps), .path = ""}, checkpoints_);
  if (primary) logger_.debug("checkpoint written", {{"dir", path}, {"step", steps}});
  lastSaved_ = steps;
  metrics.event("checkpoint", steps);
}

void FitCheckpoints::saveAtEnd(int64_t steps, MetricsLog& metrics, bool primary) {
  if (lastSaved_ != steps) save(steps, metrics, primary);
}

void FitCheckpoints::saveAlone(int64_t steps, MetricsLog& metrics) {
  if (options_.checkpointDir.empty()) return;
  CheckpointOptions alone = checkpoints_;
  alone.communicator = nullptr;
  const std::string path =
      train::save({&engine_}, {.step = steps, .loader = plan_.positionOf(steps), .path = ""}, alone);
  logger_.warn("elastic: checkpoint written before stopping", {{"dir", path}, {"step", steps}});
  metrics.event("checkpoint", steps);
}

}  // namespace kolo::train::detail
