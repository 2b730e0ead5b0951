// train::fit: epochs of steps from this process's DataLoader, evaluation after each epoch,
// metrics lines, progress, the numeric checks, checkpoints every N steps and at the end,
// resume from the newest good checkpoint, and the timeline's files at the end. Under an
// elastic engine the loop also commits the state after each step, admits joiners at step
// boundaries, recovers from a lost member, and repositions the loader for the new shard.
#include "kolo/train/fit.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>

#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/settings.h"
#include "kolo/trace.h"
#include "kolo/train/elastic.h"
#include "tensor/label_error.h"
#include "train/balance.h"
#include "train/batch_contract.h"
#include "train/monitor.h"
#include "train/resume.h"
#include "train/run_lines.h"
#include "train/timeline_files.h"

namespace kolo::train {
namespace {

using Clock = std::chrono::steady_clock;

// The bytes Tensor::empty charged for `t`'s storage (64-byte rounded; 0 when undefined).
int64_t storageBytes(const Tensor& t) {
  if (!t.defined() || !t.impl()->storage || !t.impl()->storage->bytes) return 0;
  const auto n = static_cast<int64_t>(t.impl()->storage->nbytes);
  return n == 0 ? 64 : (n + 63) / 64 * 64;
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

volatile std::sig_atomic_t gTerminateRequested = 0;

extern "C" void requestTerminate(int) { gTerminateRequested = 1; }

// While fit runs with checkpoints, SIGTERM only asks it to save and stop at a step's end
// (where SIGTERM had its default action); the previous action comes back when the last fit
// of the process ends (ranks as threads of one process share the handler).
class TerminateRequests {
 public:
  explicit TerminateRequests(bool wanted) : wanted_(wanted) {
    if (!wanted_) return;
    std::lock_guard<std::mutex> lock(mutex());
    if (users()++ > 0) return;
    struct sigaction current {};
    if (::sigaction(SIGTERM, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ask {};
    ask.sa_handler = requestTerminate;
    sigemptyset(&ask.sa_mask);
    ask.sa_flags = SA_RESTART;
    gTerminateRequested = 0;
    installed() = ::sigaction(SIGTERM, &ask, &previous()) == 0;
  }
  ~TerminateRequests() {
    if (!wanted_) return;
    std::lock_guard<std::mutex> lock(mutex());
    if (--users() == 0) restore();
  }
  TerminateRequests(const TerminateRequests&) = delete;
  TerminateRequests& operator=(const TerminateRequests&) = delete;

  /// Whether any rank got SIGTERM since fit started, agreed over `comm`: collective on every
  /// rank whenever checkpoints are on (whether or not this process could take the signal).
  bool agreed(comm::Communicator* comm) const {
    if (!wanted_) return false;
    int32_t asked = gTerminateRequested ? 1 : 0;
    if (comm != nullptr && comm->size() > 1)
      comm->allreduce(&asked, &asked, 1, DType::I32, comm::ReduceOp::Max);
    return asked != 0;
  }
  /// Ends the process by SIGTERM, its default action.
  [[noreturn]] void terminate() {
    {
      std::lock_guard<std::mutex> lock(mutex());
      restore();
    }
    std::fflush(nullptr);
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);
    std::_Exit(128 + SIGTERM);  // not reached
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static int& users() {
    static int n = 0;
    return n;
  }
  static bool& installed() {
    static bool b = false;
    return b;
  }
  static struct sigaction& previous() {
    static struct sigaction p {};
    return p;
  }
  static void restore() {
    if (installed()) ::sigaction(SIGTERM, &previous(), nullptr);
    installed() = false;
  }

  bool wanted_;
};

}  // namespace

int64_t stepsPerEpoch(int64_t datasetSize, int64_t batch, bool dropLast) {
  KOLO_REQUIRE(batch >= 1, "FitOptions::batch must be at least 1, got ", batch);
  const int64_t steps = dropLast ? datasetSize / batch : (datasetSize + batch - 1) / batch;
  KOLO_REQUIRE(steps > 0, "FitOptions::batch ", batch, " is larger than the training set's ",
               datasetSize, " samples: with FitOptions::dropLast no step is left");
  return steps;
}

std::string startTimeline(const std::string& directory) {
  return detail::startTimeline(directory);
}

FitSummary fit(Engine& engine, std::shared_ptr<const data::Dataset> train,
               std::shared_ptr<const data::Dataset> validation, const FitOptions& options,
               const FitCallbacks& callbacks) {
  const auto start = Clock::now();
  KOLO_REQUIRE(train != nullptr, "train::fit: no training dataset");
  KOLO_REQUIRE(options.epochs >= 0, "FitOptions::epochs must be at least 0, got ", options.epochs);
  KOLO_REQUIRE(options.steps >= 0, "FitOptions::steps must be at least 0, got ", options.steps);
  KOLO_REQUIRE(options.checkpointEvery >= 0, "FitOptions::checkpointEvery must be at least 0, got ",
               options.checkpointEvery);
  KOLO_REQUIRE(options.keepCheckpoints >= 1, "FitOptions::keepCheckpoints must be at least 1, got ",
               options.keepCheckpoints);
  KOLO_REQUIRE(options.timingSkip >= 0, "FitOptions::timingSkip must be at least 0, got ", options.timingSkip);
  KOLO_REQUIRE(options.accumulate >= 1, "FitOptions::accumulate must be at least 1, got ",
               options.accumulate);
  KOLO_REQUIRE(options.metricsEvery >= 1, "FitOptions::metricsEvery must be at least 1, got ",
               options.metricsEvery);
  keepFreedMemory();  // each step reuses the buffers the last one freed
  observe::Logger stderrLogger(stderr);
  observe::Logger& logger = options.logger ? *options.logger : stderrLogger;
  ElasticEngine* elastic = engine.elastic();
  const int64_t globalBatch = options.batch;
  // Who this process is in the job; an elastic engine's membership changes it.
  std::shared_ptr<comm::Communicator> comm;
  int rank = 0;
  bool primary = true, quiet = true;
  parallel::Balancer* balancer = nullptr;
  DataShard shard;
  auto refreshMembership = [&] {
    comm = engine.communicator();
    rank = engine.rank();
    primary = engine.isPrimary();
    quiet = options.quiet || !primary;
    balancer = engine.balancer();
    shard = engine.dataShard();
    if (balancer) {
      KOLO_REQUIRE(balancer->globalBatch() == globalBatch, "FitOptions::batch ", globalBatch,
                   " is not the balanced engine's global batch ", balancer->globalBatch());
    } else {
      const int replicasHere = engine.replicas() / std::max(1, shard.worldSize);
      KOLO_REQUIRE(globalBatch % engine.replicas() == 0, "FitOptions::batch ", globalBatch,
                   " does not split evenly over ", engine.replicas(), " replicas (", shard.worldSize,
                   " rank(s) x ", replicasHere, " per rank): use a multiple of ", engine.replicas());
      KOLO_REQUIRE(globalBatch % (engine.replicas() * options.accumulate) == 0, "FitOptions::batch ",
                   globalBatch, " does not split evenly over ", engine.replicas(), " replica(s) x ",
                   options.accumulate, " micro-batches (FitOptions::accumulate)");
    }
  };
  refreshMembership();
  engine.setAccumulate(options.accumulate);
  KOLO_REQUIRE(options.checkSyncEvery == 0 || comm != nullptr,
               "FitOptions::checkSyncEvery compares the weights of several ranks, and the engine ",
               engine.name(), " has no communicator: use an engine over the job's ranks");

  const int64_t perEpoch = stepsPerEpoch(train->size(), globalBatch, options.dropLast);
  // --steps is the total step count: it cuts --epochs short, or alone sets the length.
  int64_t totalSteps = std::max<int64_t>(options.epochs, 1) * perEpoch;
  if (options.steps > 0)
    totalSteps = options.epochs > 0 ? std::min(totalSteps, options.steps) : options.steps;
  std::unique_ptr<optim::LrSchedule> schedule =
      options.schedule ? options.schedule(totalSteps, perEpoch)
                       : std::make_unique<optim::ConstantLr>(engine.lr());
  KOLO_REQUIRE(schedule != nullptr, "train::fit: the schedule factory returned no schedule");

  // This process's part of every global batch (engine.dataShard()).
  auto makeLoader = [&] {
    return std::make_unique<data::DataLoader>(
        train,
        std::make_shared<data::DistributedSampler>(
            train, data::DistributedSamplerOptions{.globalBatch = globalBatch,
                                                           .rank = shard.rank,
                                                           .worldSize = shard.worldSize,
                                                           .shuffle = options.shuffle,
                                                           .seed = options.seed,
                                                           .dropLast = options.dropLast}),
        data::DataLoaderOptions{.batchSize = globalBatch / shard.worldSize, .prefetch = options.prefetch});
  };
  std::unique_ptr<data::DataLoader> loader = makeLoader();
  detail::BatchContract contract("the training set", [&]() -> std::optional<DType> {
    const auto parameters = engine.model().namedParameters();
    if (parameters.empty()) return std::nullopt;
    return parameters.front().second.dtype();
  }());
  // Step `at`'s place in the data (what the loader's state is after `at` steps).
  auto positionOf = [perEpoch](int64_t at) { return data::LoaderState{at / perEpoch, at % perEpoch}; };

  CheckpointOptions checkpoints{.directory = options.checkpointDir,
                                .keep = options.keepCheckpoints,
                                .communicator = comm,
                                .identity = detail::identityOf(options),
                                .warn = [&logger](const std::string& line) { logger.warn(line); }};
  int64_t step = 0;
  const bool joined = elastic && elastic->joinedAt();
  if (joined) {
    // Admitted into a running elastic job: the state came from its members.
    step = *elastic->joinedAt();
    loader->setState(positionOf(step));
  } else if (const std::string resumeDir = resumeDirectory(options.resumeDir, options.checkpointDir);
             !resumeDir.empty()) {
    CheckpointOptions from = checkpoints;
    from.directory = resumeDir;
    const Position position = detail::loadFrom({&engine}, from, "FitOptions::resumeDir");
    if (primary)
      logger.info(options.resumeDir.empty() ? "requeued Slurm job: resuming from its checkpoints" : "resuming",
                  {{"checkpoint", position.path}, {"step", position.step}});
    loader->setState(position.loader);
    step = position.step;
  }
  if (elastic) elastic->commit(step);
  auto saveCheckpoint = [&](int64_t at) {
    if (options.checkpointDir.empty()) return;
    trace::Scope span("checkpoint", "checkpoint");
    span.index(at);
    // At an epoch's end the position is the next epoch's start, as every trainer records it.
    const std::string path = save({&engine}, {.step = at, .loader = positionOf(at), .path = ""}, checkpoints);
    if (primary) logger.debug("checkpoint written", {{"dir", path}, {"step", at}});
  };

  // A resumed run continues the metrics file (and its step count).
  detail::MetricsLog metrics(primary ? options.metricsPath : "", step > 0, start);
  TerminateRequests terminateRequests(options.checkpointOnTerminate && !options.checkpointDir.empty());
  const int64_t epochs = (totalSteps + perEpoch - 1) / perEpoch;
  auto makeMonitor = [&] {
    return std::make_unique<detail::StepMonitor>(comm.get(), options.metricsEvery, globalBatch / shard.worldSize);
  };
  std::unique_ptr<detail::StepMonitor> monitor = makeMonitor();
  // A program of one's own under `kolo run --status-file` keeps its lines without a word.
  detail::RankStatus status(options.statusFile.empty() ? settings::statusFile() : options.statusFile,
                            rank, totalSteps);
  const detail::FailureEvent failureEvent(metrics, step);
  if (!joined)
    metrics.event(step > 0 ? "resume" : "start", step,
                  observe::Fields{{"ranks", comm ? comm->size() : 1},
                                  {"replicas", engine.replicas()},
                                  {"strategy", engine.name()},
                                  {"algorithm", engine.algorithm()},
                                  {"batch", globalBatch}}
                      .update(elastic ? elastic->membershipFields() : observe::Fields{}));
  if (primary && !joined) {
    observe::Fields fields = options.describe;
    fields.update({{"batch", globalBatch},
                   {"epochs", epochs},
                   {"steps", totalSteps},
                   {"first_step", step},
                   {"strategy", engine.name()},
                   {"replicas", engine.replicas()}});
    fields.update(engine.describe());
    fields.set("loader", options.prefetch > 0 ? "thread" : "inline");
    logger.info("training", fields);
  }

  // Elastic: the survivors of a failure (or the members admitting joiners) continue from
  // the state after the steps `recover` or `admitJoiners` returns; fit writes the changes'
  // events, and below the minimum the first survivor saves that state before stopping.
  auto writeElasticEvents = [&] {
    for (const ElasticEvent& event : elastic->takeEvents())
      metrics.event(event.name.c_str(), event.step, event.fields);
  };
  auto recoverFrom = [&](const Error& error) -> std::optional<int64_t> {
    comm.reset();  // the survivors' agreement needs the old communicator closed
    checkpoints.communicator.reset();
    try {
      return elastic->recover(error, step);
    } catch (const parallel::BelowMinRanksError& stop) {
      const int64_t at = stop.change().step;
      if (!options.checkpointDir.empty() && engine.isPrimary()) {
        CheckpointOptions alone = checkpoints;
        alone.communicator = nullptr;
        const std::string path = save({&engine}, {.step = at, .loader = positionOf(at), .path = ""}, alone);
        logger.warn("elastic: checkpoint written before stopping", {{"dir", path}, {"step", at}});
        metrics.event("checkpoint", at);
      }
      throw;
    }
  };
  auto reposition = [&](int64_t at) {
    step = at;
    refreshMembership();
    checkpoints.communicator = comm;
    loader = makeLoader();
    loader->setState(positionOf(at));
    monitor = makeMonitor();
    if (primary) metrics.open(options.metricsPath, true);
    writeElasticEvents();
  };

  std::string breakdown;  // the last interval's step-time breakdown, for the progress line
  double intervalLoss = 0.0;
  int64_t intervalSteps = 0;
  FitSummary summary;
  double trainSeconds = 0.0, steadySeconds = 0.0;
  int64_t trainSteps = 0, steadySteps = 0;
  int64_t lastCheckpoint = -1;
  bool evaluated = false;
  const int64_t tensorBase = engine.tensorBytesBefore();
  detail::RankFiguresLog rankFigures(tensorBase);
  auto validate = [&]() -> std::optional<EvaluateResult> {
    if (!validation) return std::nullopt;
    trace::Scope span("evaluate", "train");
    return engine.evaluate(*validation);
  };
  // Tensor bytes beyond the data set: the most alive during a step (its batch included), and
  // what a step leaves alive besides its batch (parameters, gradients, optimizer state).
  int64_t stepPeakBytes = 0, stateBytes = 0;
  // The epoch's figures so far (an elastic membership change resumes the epoch).
  double lossSum = 0.0, epochSeconds = 0.0;
  int64_t lossCount = 0;
  while (step < totalSteps) {
    const data::LoaderState at = loader->state();
    const int64_t epochSteps = std::min(perEpoch - at.batch, totalSteps - step);
    observe::ProgressBar bar("epoch " + std::to_string(at.epoch + 1) + "/" + std::to_string(epochs),
                             at.batch + epochSteps, stderr, 100, options.progress);
    std::optional<int64_t> regrouped;  // elastic: the step the new generation continues from
    int64_t stepsThisPass = 0;
    data::Batch batch;
    while (step < totalSteps) {
      const auto stepStart = Clock::now();
      trace::Scope stepSpan("step", "train");
      stepSpan.index(step);
      {
        trace::Scope dataSpan("data", "data");
        if (!loader->next(batch)) break;
        contract.check(batch);
      }
      const double dataSeconds = secondsSince(stepStart);
      if (options.anomalyDetector) options.anomalyDetector->beginStep(step);
      const auto beginStart = Clock::now();
      if (callbacks.onStepBegin) callbacks.onStepBegin(step);
      const double beginSeconds = secondsSince(beginStart);
      const auto computeStart = Clock::now();
      resetPeakTensorBytes();
      const int64_t bytesBeforeStep = liveTensorBytes();
      const double blockedBefore = comm::blockedSeconds();
      const double lr = schedule->lrAt(step);
      double loss = 0.0;
      try {
        if (elastic) regrouped = elastic->admitJoiners(step);
        if (regrouped) break;
        loss = engine.step(batch, lr);
      } catch (const ::kolo::detail::LabelOutOfRange&) {
        contract.rethrowNamingTheLabel(batch);
      } catch (const Error& error) {
        if (!elastic || !(regrouped = recoverFrom(error))) throw;
        break;
      }
      const int64_t peakBytes = peakTensorBytes();
      stepPeakBytes = std::max(stepPeakBytes, peakBytes);
      stateBytes = liveTensorBytes() - storageBytes(batch.inputs) - storageBytes(batch.labels);
      // Where no reducer times the communication, the time this thread waited in it.
      const double blocked = engine.reducer() ? 0.0 : comm::blockedSeconds() - blockedBefore;
      const double compute =
          std::max(detail::computeSeconds(secondsSince(computeStart), engine.reducer()) - blocked, 0.0);
      const double seconds = secondsSince(stepStart);
      StepFigures stepFigures{.computeSeconds = compute, .peakStepBytes = peakBytes - bytesBeforeStep};
      engine.refineStepFigures(stepFigures);
      rankFigures.record(stepFigures, seconds, peakBytes, trainSteps + lossCount >= options.timingSkip);
      if (options.anomalyDetector) {
        if (comm && comm->size() > 1) options.anomalyDetector->agree(*comm);
        else options.anomalyDetector->throwIfFound();
      }
      if (options.checkSyncEvery > 0 && (step + 1) % options.checkSyncEvery == 0)
        observe::checkReplicasInSync(*comm, engine.model().stateDict(), step + 1);
      monitor->record(dataSeconds, seconds, engine.reducer(), blocked);
      if (!std::isfinite(loss))
        KOLO_THROW(DivergedError, "training diverged: loss ", loss, " at step ", step, " (lr ",
                   lr, "); try a smaller learning rate");
      if (callbacks.onStepEnd)
        callbacks.onStepEnd({.step = step, .loss = loss, .lr = lr, .seconds = seconds,
                             .computeSeconds = compute, .batch = &batch});
      ++step;
      ++stepsThisPass;
      if (elastic) {
        elastic->commit(step);
        writeElasticEvents();
      }
      epochSeconds += seconds;
      if (trainSteps + lossCount >= options.timingSkip) {
        steadySeconds += seconds;
        ++steadySteps;
      }
      lossSum += loss;
      ++lossCount;
      intervalLoss += loss;
      ++intervalSteps;
      status.update("training", step, loss, seconds, globalBatch / std::max(seconds, 1e-9));
      std::optional<detail::IntervalTimes> interval;
      bool terminate = false;
      try {
        terminate = terminateRequests.agreed(comm.get());
        if (balancer) {
          balancer->record(beginSeconds + compute);
          detail::replanWhenDue(*balancer, *comm, step, primary, logger, metrics.writer());
        }
        interval = monitor->endOfStep(step);
      } catch (const Error& error) {
        if (!elastic || !(regrouped = recoverFrom(error))) throw;
        break;
      }
      if (interval) {
        breakdown = "  " + interval->progressText();
        if (metrics.writer()) {
          observe::Fields fields = interval->fields(engine.algorithm());
          fields.set("wall_s", secondsSince(start));
          fields.set("train_loss", intervalLoss / std::max<int64_t>(intervalSteps, 1));
          fields.set("lr", engine.lr());
          if (elastic) fields.update(elastic->membershipFields());
          metrics.write(fields);
        }
        intervalLoss = 0.0;
        intervalSteps = 0;
      }
      if (terminate || (options.checkpointEvery > 0 && step % options.checkpointEvery == 0)) {
        status.update("checkpoint", step);
        saveCheckpoint(step);
        lastCheckpoint = step;
        metrics.event("checkpoint", step);
      }
      if (terminate) {
        logger.warn("SIGTERM: stopping after the checkpoint of this step",
                    {{"step", step}, {"dir", options.checkpointDir}});
        metrics.event("failed", step, {{"signal", "SIGTERM"}});
        terminateRequests.terminate();
      }
      if (!quiet) {
        char suffix[96];
        std::snprintf(suffix, sizeof(suffix), "loss %.4f  %s samples/s", lossSum / lossCount,
                      detail::formatRate(lossCount * globalBatch / std::max(epochSeconds, 1e-9)).c_str());
        bar.update(at.batch + stepsThisPass, suffix + breakdown);
      }
    }
    if (regrouped) {
      reposition(*regrouped);
      continue;
    }
    KOLO_CHECK(lossCount > 0, "the data loader gave no batch at epoch ", at.epoch, " batch ",
               at.batch);
    // A run stopped by `steps` mid-epoch leaves the loader where it is; a full epoch ends
    // with next() returning false, which moves the loader to the next epoch.
    trainSeconds += epochSeconds;
    trainSteps += lossCount;
    summary.trainLoss = lossSum / lossCount;
    status.update("evaluating", step);
    const std::optional<EvaluateResult> figures = validate();
    if (figures) {
      summary.validationAccuracy = figures->accuracy;
      summary.validationLoss = figures->loss;
    }
    evaluated = true;
    summary.epochs = at.epoch + 1;
    const double rate = lossCount * globalBatch / std::max(epochSeconds, 1e-9);
    const EpochEnd ended{.epoch = at.epoch + 1, .step = step, .trainLoss = summary.trainLoss,
                         .validation = figures, .samplesPerSecond = rate};
    if (callbacks.onEpochEnd) callbacks.onEpochEnd(ended);
    if (!quiet) bar.finish(detail::epochProgressText(summary.trainLoss, figures, rate));
    metrics.write(detail::epochFields(ended, secondsSince(start), engine.lr()));
    lossSum = epochSeconds = 0.0;
    lossCount = 0;
  }
  if (elastic && primary) elastic->finish();  // ranks still waiting to join stop waiting
  if (trainSteps > 0)
    logger.info("tensor memory", {{"rank", rank},
                                  {"state_bytes", stateBytes - tensorBase},
                                  {"step_peak_bytes", stepPeakBytes - tensorBase}});
  if (!evaluated) {
    const std::optional<EvaluateResult> figures = validate();
    if (figures) {
      summary.validationAccuracy = figures->accuracy;
      summary.validationLoss = figures->loss;
    }
    summary.epochs = loader->state().epoch;
  }
  summary.steps = step;
  summary.samplesPerSecond = trainSteps * globalBatch / std::max(trainSeconds, 1e-9);
  summary.steadySamplesPerSecond = steadySteps > 0
                                       ? steadySteps * globalBatch / std::max(steadySeconds, 1e-9)
                                       : summary.samplesPerSecond;
  if (const parallel::Reducer* reducer = engine.reducer(); reducer && trainSteps > 0)
    summary.gradBytesPerStep = static_cast<double>(reducer->bytesSent()) / trainSteps;
  if (lastCheckpoint != step && trainSteps > 0) {
    saveCheckpoint(step);
    if (!options.checkpointDir.empty()) metrics.event("checkpoint", step);
  }
  summary.ranks = rankFigures.gather(comm.get());
  // The engine owns its model; the summary's handle is valid while the engine lives.
  summary.model = std::shared_ptr<nn::Module>(std::shared_ptr<nn::Module>(), &engine.model());
  summary.wallSeconds = secondsSince(start);
  const observe::Fields endFields = callbacks.onEnd ? callbacks.onEnd(summary) : observe::Fields{};
  metrics.event("end", step);  // before the final line, which stays the file's last
  observe::Fields last = detail::finalFields(summary, validation != nullptr);
  if (elastic) last.update(elastic->membershipFields());
  last.update(endFields);
  last.set("final", true);
  metrics.write(last);
  if (options.finishTimeline) detail::finishTimeline(comm.get(), primary, logger);
  return summary;
}

}  // namespace kolo::train
