// fit's checkpoints and resume, one of its pieces: where a run resumes (resumeDir, or a
// requeued Slurm job's checkpointDir), when it saves (every checkpointEvery steps, at a
// SIGTERM, at the end, and alone before an elastic job stops), and at which position: the
// loader's place after the step, an epoch's end being the next epoch's start.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kolo/comm/communicator.h"
#include "kolo/observe.h"
#include "kolo/train/engine.h"
#include "kolo/train/fit.h"
#include "kolo/train/state.h"
#include "train/fit_plan.h"
#include "train/run_lines.h"

namespace kolo::train::detail {

class FitCheckpoints {
 public:
  /// Checkpoints of `engine` as `options` ask, over `comm` (null: one process); references
  /// are kept for the run.
  FitCheckpoints(Engine& engine, const FitOptions& options, const FitPlan& plan,
                 std::shared_ptr<comm::Communicator> comm, observe::Logger& logger);

  /// Loads the newest good checkpoint of the directory the run resumes from into the engine
  /// and returns its position (logged on the primary); none when the run starts fresh.
  /// Collective. Throws what train::load throws, naming FitOptions::resumeDir.
  std::optional<Position> resume(bool primary);
  /// Whether a checkpoint is due after `steps` steps by checkpointEvery.
  bool due(int64_t steps) const;
  /// Saves the engine's state after `steps` steps and records the event (nothing without a
  /// checkpointDir). Collective.
  void save(int64_t steps, MetricsLog& metrics, bool primary);
  /// At the run's end: saves unless `steps` was just saved.
  void saveAtEnd(int64_t steps, MetricsLog& metrics, bool primary);
  /// Elastic, below the minimum: the first survivor saves the state the members agreed on,
  /// alone (the communicator is gone). Not collective.
  void saveAlone(int64_t steps, MetricsLog& metrics);
  /// The job's communicator after an elastic membership change (null while regrouping).
  void setCommunicator(std::shared_ptr<comm::Communicator> comm) { checkpoints_.communicator = std::move(comm); }

 private:
  Engine& engine_;
  const FitOptions& options_;
  FitPlan plan_;
  CheckpointOptions checkpoints_;
  observe::Logger& logger_;
  int64_t lastSaved_ = -1;
};

}  // namespace kolo::train::detail
