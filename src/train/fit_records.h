// fit's metrics and progress, one of its pieces: what a run tells while it runs and leaves
// behind. The metrics file (start/resume event, interval lines of the ranks' step-time
// breakdown, epoch lines, the final line), the progress line, the status file, and the
// figures the summary reports (losses, rates, every rank's time and memory).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/observe.h"
#include "kolo/train/engine.h"
#include "kolo/train/fit.h"
#include "train/fit_plan.h"
#include "train/monitor.h"
#include "train/run_lines.h"

namespace kolo::train::detail {

class FitRecords {
 public:
  using Clock = std::chrono::steady_clock;

  /// The records of a run that starts (or resumes) at `firstStep`; the metrics file is
  /// continued when it resumes. `primary`: this process writes the metrics and progress.
  FitRecords(const FitOptions& options, const FitPlan& plan, Engine& engine, Clock::time_point start,
             int64_t firstStep, bool primary, int rank, observe::Logger& logger);

  MetricsLog& metrics() { return metrics_; }
  RankStatus& status() { return status_; }
  double wallSeconds() const;

  /// The run's membership (at the start and after an elastic change): this process's
  /// communicator, whether it writes the records, and its share of each global batch.
  void setMembership(std::shared_ptr<comm::Communicator> comm, bool primary, int ranksLoading);

  /// The start (or resume) event and the "training" log line. `extra`: the elastic
  /// membership's fields.
  void announce(int64_t step, const observe::Fields& extra);

  /// A new pass over epoch `at.epoch` from batch `at.batch`, of `steps` steps at most.
  void beginEpoch(const data::LoaderState& at, int64_t steps);
  /// One step's measurements: the engine's figures, the whole step's seconds, the tensor
  /// bytes at its fullest and those it left alive besides its batch, seconds waiting for
  /// data, the communication nothing overlapped (no reducer).
  void recordStep(const StepFigures& figures, double seconds, int64_t peakBytes, int64_t stateBytes,
                  double dataSeconds, double blockedSeconds);
  /// Whether the step being recorded counts for the steady means (after timingSkip).
  bool steady() const { return trainSteps_ + lossCount_ >= options_.timingSkip; }
  /// The step is done (`stepsDone` steps): its loss joins the epoch's and interval's figures
  /// and the status line.
  void stepDone(int64_t stepsDone, double loss, double seconds);
  /// Collective: at the end of an interval, exchanges the ranks' times (StepMonitor).
  std::optional<IntervalTimes> endOfStep(int64_t stepsDone) { return monitor_->endOfStep(stepsDone); }
  /// The interval line (with `extra` fields) and the progress line's breakdown.
  void writeInterval(const IntervalTimes& interval, const observe::Fields& extra);
  /// The progress line after `stepsThisPass` steps of the pass.
  void showProgress(int64_t stepsThisPass);

  /// The epoch's end: its figures, the validation's (none without a validation set).
  EpochEnd endEpoch(const data::LoaderState& at, int64_t stepsDone,
                    const std::optional<EvaluateResult>& validation);
  /// After the epoch's callback: the progress line's end and the epoch line.
  void writeEpoch(const EpochEnd& ended);
  /// Steps trained in this run (resumed ones not counted).
  int64_t trainSteps() const { return trainSteps_; }

  /// The summary's figures after `stepsDone` steps (validation, epochs, model and ranks
  /// left to the caller), and the "tensor memory" log line. Collective (the ranks' figures).
  FitSummary summarize(int64_t stepsDone, comm::Communicator* comm);
  /// The "end" event and the final line (with `extra` fields).
  void writeEnd(const FitSummary& summary, bool validation, const observe::Fields& extra);

 private:
  const FitOptions& options_;
  const FitPlan plan_;
  Engine& engine_;
  Clock::time_point start_;
  observe::Logger& logger_;
  MetricsLog metrics_;
  RankStatus status_;
  RankFiguresLog rankFigures_;
  std::unique_ptr<StepMonitor> monitor_;
  std::unique_ptr<observe::ProgressBar> bar_;
  std::shared_ptr<comm::Communicator> comm_;
  bool primary_ = true;
  int rank_ = 0;
  int64_t firstStep_ = 0;
  data::LoaderState passStart_{};
  std::string breakdown_;  // the last interval's step-time breakdown, for the progress line
  double intervalLoss_ = 0.0;
  int64_t intervalSteps_ = 0;
  // The epoch's figures so far (an elastic membership change resumes the epoch).
  double lossSum_ = 0.0, epochSeconds_ = 0.0;
  int64_t lossCount_ = 0;
  // The run's: the epochs' sums, and those without the first timingSkip steps.
  double trainSeconds_ = 0.0, steadySeconds_ = 0.0, trainLoss_ = 0.0;
  int64_t trainSteps_ = 0, steadySteps_ = 0;
  // Tensor bytes: the most alive during a step (its batch included), and what a step leaves
  // alive besides its batch (parameters, gradients, optimizer state).
  int64_t stepPeakBytes_ = 0, stateBytes_ = 0;
};

}  // namespace kolo::train::detail
