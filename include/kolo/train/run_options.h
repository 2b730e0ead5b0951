// The options every trainer of the train layer reads alike (fit over any engine, parameter
// servers): one vocabulary, so that `batch` is the global batch, `steps` count optimizer
// steps and `checkpointEvery` counts steps wherever they appear, and a checkpoint one
// trainer writes at an epoch's end is where another resumes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "kolo/observe.h"
#include "kolo/optim.h"

namespace kolo::train {

/// Builds the learning-rate schedule of a run from its total optimizer steps and its steps
/// per epoch (both known once the trainer has seen the dataset).
using ScheduleFactory =
    std::function<std::unique_ptr<optim::LrSchedule>(int64_t totalSteps, int64_t stepsPerEpoch)>;

/// The common core of FitOptions and ParameterServerOptions (each adds what only it reads).
/// A trainer's errors name the option as its own struct's member (FitOptions::batch).
struct RunOptions {
  /// Epochs over the training set. 0 (the default): `steps` alone sets the length, or one
  /// epoch without it.
  int64_t epochs = 0;
  /// Total optimizer steps of the run, resumed steps included (0: all `epochs`). With both
  /// set, the run ends at whichever comes first. A step is one global batch.
  int64_t steps = 0;
  /// The global batch: samples per optimizer step over every replica (worker) of the job.
  /// Where the replicas share a step, it must split evenly over them (InvalidArgument
  /// otherwise). An epoch has floor(training samples / batch) steps.
  int64_t batch = 128;
  /// Shuffle the training set each epoch (seeded by `seed`); false: file order.
  bool shuffle = true;
  uint64_t seed = 0;
  /// The learning rate per step; default: the optimizer's own, constant.
  ScheduleFactory schedule{};

  /// Metrics as JSON lines, written by the job's primary process (rank 0, or the
  /// parameter-server chief) ("" : none): start/resume, checkpoint, end and failure events, a
  /// line per epoch and a final summary line (docs/training.md).
  std::string metricsPath{};
  /// The primary process's progress on stderr: -1 a bar on a terminal and plain lines
  /// otherwise, 0 plain lines, 1 a bar. `quiet` hides the progress line only; log lines
  /// (training, resuming, checkpoints, warnings) still go to `logger`.
  int progress = -1;
  bool quiet = false;
  /// Each process keeps its step, epoch, loss and state in FILE.rank-N (`kolo status FILE`,
  /// train::readRankStatus); "" : the one `kolo run --status-file` passes through the
  /// environment (KOLO_STATUS_FILE), else none. Under parameter servers N is the launch
  /// order (servers, the chief, the workers): a worker's step counts its pushes, a server's
  /// its updates ("serving"), the chief's the servers' updates at each epoch's end
  /// ("dispatching").
  std::string statusFile{};

  /// Checkpoints (train::save) into `checkpointDir` ("" : none) every `checkpointEvery`
  /// steps (0: only at the end) and at the end, the last `keepCheckpoints` kept. A
  /// checkpoint at an epoch's end is recorded as the next epoch's start, so any trainer
  /// resumes it there.
  std::string checkpointDir{};
  int64_t checkpointEvery = 0;
  int keepCheckpoints = 3;
  /// Continue from the newest good checkpoint in this directory ("" : start fresh): a
  /// missing directory is a FileError saying so, as is one without a good checkpoint.
  /// `steps` stays the total. Without it, a requeued Slurm job resumes from checkpointDir
  /// (train::resumeDirectory).
  std::string resumeDir{};
  /// What fixes the weights' shapes and the data order, stored in every checkpoint; a resume
  /// whose checkpoint has other values is refused (Mismatch naming the key and both values).
  /// The trainer adds what it knows where the caller did not set it: "batch" (the global
  /// batch), "seed" and "model" (the parameters' count and elements).
  std::map<std::string, std::string> identity{};

  /// Log lines (start, resume, checkpoints, warnings); null: stderr.
  observe::Logger* logger = nullptr;
  /// Further fields of the "training" log line (model, optimizer, ...).
  observe::Fields describe{};
};

}  // namespace kolo::train
