// train::fit: the one training loop over any Engine, in the manner of Keras's `fit`: epochs
// or a step count over a dataset, a learning-rate schedule, evaluation after each epoch,
// metrics records (the JSON lines `kolo report` reads), a progress line, the numeric checks
// (divergence, anomalies, replicas in sync), checkpoints and resume, and callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/data.h"
#include "kolo/numerics.h"
#include "kolo/observe.h"
#include "kolo/optim.h"
#include "kolo/train/engine.h"
#include "kolo/train/run_options.h"

namespace kolo::train {

/// How fit trains: the options every trainer reads (RunOptions: epochs, steps, the global
/// batch, data order, schedule, metrics, progress, status file, checkpoints, resume,
/// identity, logger) and fit's own.
struct FitOptions : RunOptions {
  /// Gradient accumulation: every replica takes its part of each global batch as this many
  /// equal micro-batches, with no gradient communication until the last (Engine::
  /// setAccumulate); `batch` stays the samples per optimizer step and must split evenly
  /// over replicas x accumulate (InvalidArgument otherwise, or from an engine that cannot).
  int accumulate = 1;
  /// A last global batch shorter than `batch` is dropped (true) or padded from the epoch's
  /// start (false).
  bool dropLast = true;
  /// Batches the loader gathers ahead on a thread of its own (0: on the training thread).
  int prefetch = 2;
  /// An interval metrics line every `metricsEvery` steps (the ranks' step-time breakdown).
  int64_t metricsEvery = 50;
  /// Steps at the start left out of the steady-state throughput.
  int64_t timingSkip = 20;
  /// With a checkpointDir: a SIGTERM (kolo run stopping the job, Slurm preempting or
  /// cancelling it, Kubernetes deleting the pod) lets the step under way finish, the ranks
  /// agree on it at the step's end, a checkpoint of it is saved, and the process then ends by
  /// SIGTERM as it would have at once; a later run with resumeDir continues from there. Only
  /// where SIGTERM has its default action when fit starts (a program's own handler is kept).
  /// false, or without a checkpointDir: SIGTERM ends the process at once.
  bool checkpointOnTerminate = true;

  /// Every N steps compare a hash of every rank's weights and throw ReplicaMismatch naming
  /// the ranks that differ and the first tensor (0: off). Needs an engine with a
  /// communicator.
  int64_t checkSyncEvery = 0;
  /// Checked after every step, agreed over the ranks: throws DivergedError naming the first
  /// module, rank and step with a NaN or infinity (null: off). Build it over engine.model().
  std::shared_ptr<observe::AnomalyDetector> anomalyDetector{};
  /// Stop recording the timeline at the end (when one is recording, see startTimeline),
  /// write each rank's file and merge them into DIR/trace.json on rank 0.
  bool finishTimeline = true;
};

/// What a step ended with (FitCallbacks::onStepEnd).
struct StepEnd {
  int64_t step = 0;       // the step's index (0-based); step + 1 steps are done
  double loss = 0.0;      // the global batch's mean loss
  double lr = 0.0;        // the learning rate it used
  double seconds = 0.0;   // the whole step, loading its batch included
  double computeSeconds = 0.0;  // forward, backward and update, less waiting for other ranks
  /// The batch this process loaded for the step (its part of the global batch); valid
  /// during the call.
  const data::Batch* batch = nullptr;
};

/// What an epoch ended with (FitCallbacks::onEpochEnd).
struct EpochEnd {
  int64_t epoch = 0;       // 1-based
  int64_t step = 0;        // steps done
  double trainLoss = 0.0;  // mean of the epoch's step losses
  /// The validation set's figures (none without one).
  std::optional<EvaluateResult> validation{};
  double samplesPerSecond = 0.0;
};

/// One rank's figures over a fit (FitSummary::ranks).
struct RankFigures {
  int rank = 0;
  /// Per step: the mean over the steps after FitOptions::timingSkip (over every step when
  /// there were no more).
  double computeSeconds = 0.0;  // forward, backward and update, less waiting (StepFigures)
  double stepSeconds = 0.0;     // the whole step, loading its batch included
  /// Peaks over every step.
  int64_t peakStepBytes = 0;    // tensor bytes a step held beyond those alive before it
  /// Tensor bytes alive at the fullest moment of a step, beyond those alive before the
  /// engine was built (the data set): weights, optimizer state and the step's own.
  int64_t peakTensorBytes = 0;
  int64_t peakMicroBatchesHeld = 0;  // pipeline stages (1 elsewhere)
  int64_t peakBoundaryBytes = 0;     // pipeline stages (0 elsewhere)
  /// The process's peak resident memory so far (getrusage), tensors or not.
  int64_t peakResidentBytes = 0;
};

/// What a finished fit reports (on every rank; the loss and accuracy are global), and the
/// figures every trainer reports alike (ParameterServerSummary adds its own).
struct FitSummary {
  /// The trained model: fit's engine.model() (owned by the engine, valid while it lives;
  /// under fsdp whole only after engine.gatherModel()), the parameter-server chief's model
  /// holding the servers' final weights; null on a process that holds no whole model (a
  /// parameter server, a worker).
  std::shared_ptr<nn::Module> model{};
  int64_t steps = 0;       // the step count reached (resumed steps included)
  int64_t epochs = 0;      // epochs begun
  double trainLoss = 0.0;  // mean loss over the last epoch's steps
  /// The validation set's accuracy and mean loss after the last step (0 without one; see
  /// EvaluateResult).
  double validationAccuracy = 0.0;
  double validationLoss = 0.0;
  double samplesPerSecond = 0.0;        // global samples per second of training time
  double steadySamplesPerSecond = 0.0;  // the same without the first timingSkip steps
  double wallSeconds = 0.0;
  /// Bytes this rank handed to gradient collectives per step (0 without a reducer).
  double gradBytesPerStep = 0.0;
  /// Every rank's figures, in rank order of the engine's communicator at the end (this
  /// process's alone without one): where the time and the memory went, rank by rank.
  std::vector<RankFigures> ranks{};
};

/// Hooks into the loop, called on every rank; an exception from one ends fit (rank 0 writes
/// a "failed" event).
struct FitCallbacks {
  /// Before step `step` (0-based) computes, once its batch is loaded. Time spent here counts
  /// as this rank's busy time for balancing, not as its compute.
  std::function<void(int64_t step)> onStepBegin{};
  /// After a step and its checks, before its metrics and progress.
  std::function<void(const StepEnd&)> onStepEnd{};
  /// After an epoch's evaluation, before its metrics line.
  std::function<void(const EpochEnd&)> onEpochEnd{};
  /// After the last step, evaluation and checkpoint, before the "end" event: further fields
  /// of the final metrics line (rank 0's are written), e.g. a figure the caller computes
  /// over the trained model. Called on every rank, so it may be collective.
  std::function<observe::Fields(const FitSummary&)> onEnd{};
};

/// The number of optimizer steps in one epoch of `datasetSize` samples at global batch
/// `batch`. Throws InvalidArgument when no step is left (a batch larger than the dataset
/// with dropLast).
int64_t stepsPerEpoch(int64_t datasetSize, int64_t batch, bool dropLast);

/// Trains `engine` on `train` until options.steps or the last epoch (after resuming from
/// options.resumeDir), evaluating on `validation` (may be null) after each epoch and at the
/// end; rank 0 writes metrics, checkpoints and progress. Each process loads its part of
/// every global batch (engine.dataShard(), a data::DistributedSampler). Blocking; collective
/// over the engine's ranks: every rank calls fit with the same options. Throws
/// InvalidArgument for bad options, DivergedError when the loss is not finite (naming the
/// step and lr) or the anomaly detector finds a NaN, ReplicaMismatch from checkSyncEvery,
/// and what the engine, the checkpoint or the callbacks throw. Calls kolo::keepFreedMemory().
///
/// With an elastic engine (engine.elastic(), train::ElasticEngine) fit also drives its
/// protocol: a joiner starts at the step it was admitted at (not from resumeDir); the state
/// is committed after every step; at each step boundary, after onStepBegin, waiting joiners
/// are admitted; a PeerError or Timeout from a step (or from the balancer's or the
/// metrics' exchange after it) makes the survivors regroup. After either change fit
/// continues from the step the members agreed on with the new shard (rank, world size):
/// the loader is repositioned there, so every sample of each epoch is still used once and
/// the global batches are one device's. Rank 0 of each generation writes the metrics (a
/// new one appends), with "membership", "joined" and "recovered" events and world_size and
/// generation on the interval and final lines. When the job falls below its minimum, the
/// first survivor saves the state the members agreed on into checkpointDir before fit
/// rethrows parallel::BelowMinRanksError.
FitSummary fit(Engine& engine, std::shared_ptr<const data::Dataset> train,
               std::shared_ptr<const data::Dataset> validation, const FitOptions& options,
               const FitCallbacks& callbacks = {});

/// One rank's line of a status file (FitOptions::statusFile), as `kolo status` shows it.
struct RankStatusLine {
  int rank = 0;
  int64_t pid = 0;
  /// starting, training, evaluating, checkpoint, done or failed; in a parameter-server job
  /// the servers are "serving" and the chief "dispatching" between its epochs' evaluations
  /// and checkpoints (only "training" ranks are compared for a straggler).
  std::string state{};
  /// The process is not there any more and its line does not say it ended (killed).
  bool gone = false;
  int64_t step = 0;        // steps done (a parameter-server worker: its pushes)
  int64_t totalSteps = 0;
  int64_t epoch = 0;       // the epoch under way (1-based); 0 before the first
  double loss = 0.0;       // the last step's
  double stepSeconds = 0.0;
  double samplesPerSecond = 0.0;
  double updated = 0.0;    // when the line was written, seconds since the Unix epoch
};

/// Every rank's line of the status file `file` (the ranks keep FILE.rank-N), by rank; none
/// when no rank has written yet. Another process may read them while the job runs: lines are
/// replaced whole. Throws FileError when the directory cannot be read, FormatError naming a
/// file that holds no status line.
std::vector<RankStatusLine> readRankStatus(const std::string& file);

/// The training rank furthest behind (the lowest step of those in state "training") and the
/// furthest rank's step, as `kolo status` names it; rank -1 when no rank is behind another.
struct Straggler {
  int rank = -1;
  int64_t step = 0;
  int64_t furthestStep = 0;
};
Straggler findStraggler(const std::vector<RankStatusLine>& lines);

/// The lines as `kolo status` prints them: a header, then per rank its pid, state ("(gone)"
/// appended for a vanished process), step/total, epoch, loss, step time (ms), samples/s and
/// how long before `now` (seconds since the Unix epoch) the line was written; then
/// "behind: rank R (step S; the furthest rank is at step F)" when findStraggler names one.
std::string rankStatusTable(const std::vector<RankStatusLine>& lines, double now);

/// Starts recording the timeline of this process into `directory` (or KOLO_TIMELINE's when
/// "" ; nothing when both are empty), also written at exit so that a failed run leaves its
/// spans. Call it before joining the job (parallel::init, building the engine), so that the
/// rendezvous aligns the ranks' clocks. Returns the directory ("" when off).
std::string startTimeline(const std::string& directory = "");

}  // namespace kolo::train
