// The Trainer's loop: epochs of synchronous steps from the process's DataLoader, evaluation
// after each epoch, metrics lines, progress, checkpoints every N steps and at the end,
// resume from the newest good checkpoint, and the final weights on disk (rank 0 writes).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>

#include "cli/train_balance.h"
#include "cli/train_checks.h"
#include "cli/train_compress.h"
#include "cli/train_loop.h"
#include "cli/train_monitor.h"
#include "cli/train_timeline.h"
#include "kolo/checkpoint.h"
#include "kolo/memory.h"
#include "kolo/safetensors.h"
#include "kolo/trace.h"

namespace kolo::cli {
namespace {

// The bytes Tensor::empty charged for `t`'s storage (64-byte rounded; 0 when undefined).
int64_t storageBytes(const Tensor& t) {
  if (!t.defined() || !t.impl()->storage || !t.impl()->storage->bytes) return 0;
  const auto n = static_cast<int64_t>(t.impl()->storage->nbytes);
  return n == 0 ? 64 : (n + 63) / 64 * 64;
}

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string formatRate(double samplesPerSecond) {
  char text[32];
  if (samplesPerSecond >= 1000) {
    std::snprintf(text, sizeof(text), "%.1fk", samplesPerSecond / 1000);
  } else {
    std::snprintf(text, sizeof(text), "%.0f", samplesPerSecond);
  }
  return text;
}

}  // namespace

std::map<std::string, std::string> runIdentity(const TrainConfig& config) {
  std::map<std::string, std::string> identity = {{"model", config.model},
                                                 {"batch", std::to_string(config.batch)},
                                                 {"seed", std::to_string(config.seed)}};
  if (config.model == "lm") {
    identity["layers"] = std::to_string(config.layers);
    identity["d_model"] = std::to_string(config.dModel);
    identity["seq_len"] = std::to_string(config.seqLen);
  }
  return identity;
}

void Trainer::saveCheckpoint(int64_t step, const data::DataLoader& loader) {
  if (config_.checkpointDir.empty()) return;
  trace::Scope span("checkpoint", "checkpoint");
  span.index(step);
  strategy_->consolidateState();
  parallel::NamedTensors hookState = gatherCompressionState(comm_.get(), *strategy_);
  if (!isPrimary()) return;
  checkpoint::CheckpointManager manager(config_.checkpointDir, config_.keepCheckpoints, true,
                                        [this](const std::string& line) { logger_.warn(line); });
  checkpoint::TrainingState state;
  state.step = step;
  state.epoch = loader.state().epoch;
  state.loader = loader.state();
  state.extra = runIdentity(config_);
  state.extra["strategy"] = strategy_->name();
  state.extra["replicas"] = std::to_string(strategy_->replicas());
  state.tensors = std::move(hookState);
  const std::string path = manager.save(model().stateDict(), &strategy_->checkpointOptimizer(), state);
  logger_.debug("checkpoint written", {{"dir", path}, {"step", step}});
}

int64_t Trainer::resume(data::DataLoader& loader) {
  // Rank 0 reads the checkpoint and tells every rank whether it could (so that none waits
  // for a rank 0 that failed) and where the run stands.
  int64_t position[4] = {0, 0, 0, 0};  // ok, step, loader epoch, loader batch
  std::exception_ptr problem;
  parallel::NamedTensors hookState;  // rank 0: the communication hooks' state, if saved
  strategy_->gatherModel();  // fsdp: whole parameters to load into (collective)
  if (isPrimary()) {
    try {
      checkpoint::CheckpointManager manager(
          config_.resumeDir, config_.keepCheckpoints, false,
          [this](const std::string& line) { logger_.warn(line); });
      const std::optional<checkpoint::CheckpointInfo> found = manager.latestGood();
      if (!found) KOLO_THROW(FileError, "--resume ", config_.resumeDir, ": no good checkpoint there");
      const checkpoint::TrainingState state =
          checkpoint::CheckpointManager::load(found->path, model().stateDict(),
                                              &strategy_->checkpointOptimizer());
      for (const auto& [key, value] : runIdentity(config_)) {
        const auto it = state.extra.find(key);
        if (it != state.extra.end() && it->second != value)
          KOLO_THROW(Mismatch, "--resume ", found->path, ": the checkpoint was written with --",
                     key, " ", it->second, ", this run has ", value);
      }
      hookState = state.tensors;
      position[0] = 1;
      position[1] = state.step;
      position[2] = state.loader.epoch;
      position[3] = state.loader.batch;
      logger_.info("resuming", {{"checkpoint", found->path}, {"step", state.step}});
    } catch (const Error&) {
      problem = std::current_exception();
    }
  }
  if (comm_ && comm_->size() > 1) comm_->broadcast(position, 4, DType::I64, 0);
  if (position[0] == 0) {
    if (problem) std::rethrow_exception(problem);
    KOLO_THROW(PeerError, "rank ", rank(), ": rank 0 could not resume from ", config_.resumeDir);
  }
  strategy_->syncReplicas();
  scatterCompressionState(comm_.get(), *strategy_, hookState);
  loader.setState({position[2], position[3]});
  return position[1];
}

TrainSummary Trainer::run() {
  const auto start = Clock::now();
  const bool primary = isPrimary();
  const bool quiet = config_.quiet || !primary;
  const int64_t globalBatch = config_.batch;
  data::DataLoader loader(
      train_, makeSampler(train_->size()),
      {.batchSize = balancer_ ? globalBatch : globalBatch / strategy_->dataWorldSize(), .prefetch = prefetch_});
  int64_t step = config_.resumeDir.empty() ? 0 : resume(loader);
  std::unique_ptr<observe::MetricsWriter> metrics;
  if (primary && !config_.metricsPath.empty()) {
    // A resumed run continues the metrics file (and its step count).
    metrics = std::make_unique<observe::MetricsWriter>(config_.metricsPath, step > 0);
  }
  const int64_t epochs = (totalSteps_ + stepsPerEpoch_ - 1) / stepsPerEpoch_;
  TrainChecks checks(config_, model(), comm_.get(),
                     strategy_->kind() == parallel::StrategyKind::OneDevice);
  StepMonitor monitor(comm_.get(), config_.metricsEvery, globalBatch / strategy_->dataWorldSize());
  RankStatus status(config_.statusFile, rank(), totalSteps_);
  // Events for `kolo report`: the run's start (or resume), its checkpoints, its end, and a
  // failure when an exception leaves the loop.
  auto event = [&](const char* name, int64_t at, observe::Fields extra = {}) {
    if (!metrics) return;
    observe::Fields fields{{"kind", "event"}, {"event", name}, {"step", at},
                           {"wall_s", secondsSince(start)}};
    metrics->write(fields.update(extra));
  };
  struct FailureEvent {
    std::function<void()> write;
    int uncaught = std::uncaught_exceptions();
    ~FailureEvent() {
      if (std::uncaught_exceptions() > uncaught) write();
    }
  } failureEvent{[&] {
    try {
      event("failed", step);
    } catch (const std::exception&) {
    }
  }};
  event(step > 0 ? "resume" : "start", step,
        {{"ranks", comm_ ? comm_->size() : 1},
         {"replicas", strategy_->replicas()},
         {"strategy", strategy_->name()},
         {"algorithm", config_.algorithm},
         {"batch", globalBatch}});
  std::string breakdown;  // the last interval's step-time breakdown, for the progress line
  SlowRank slowRank(config_.slowWorker, rank(), config_.slowFactor);
  double intervalLoss = 0.0;
  int64_t intervalSteps = 0;
  if (primary) {
    logger_.info("training", {{"model", config_.model},
                              {"optimizer", recipe_.optimizer},
                              {"lr", recipe_.lr},
                              {"schedule", recipe_.schedule},
                              {"batch", globalBatch},
                              {"epochs", epochs},
                              {"steps", totalSteps_},
                              {"first_step", step},
                              {"strategy", strategy_->name()},
                              {"replicas", strategy_->replicas()},
                              {"update", strategy_->reducer() && strategy_->reducer()->sharded()
                                             ? "sharded"
                                             : "whole"},
                              {"loader", prefetch_ > 0 ? "thread" : "inline"}});
  }

  TrainSummary summary;
  double trainSeconds = 0.0, steadySeconds = 0.0;
  int64_t trainSteps = 0, steadySteps = 0;
  int64_t lastCheckpoint = -1;
  bool evaluated = false;
  // Tensor bytes beyond the data set: the most alive during a step (its batch included), and
  // what a step leaves alive besides its batch (parameters, gradients, optimizer state).
  int64_t stepPeakBytes = 0, stateBytes = 0;
  while (step < totalSteps_) {
    const data::LoaderState at = loader.state();
    const int64_t epochSteps = std::min(stepsPerEpoch_ - at.batch, totalSteps_ - step);
    observe::ProgressBar bar("epoch " + std::to_string(at.epoch + 1) + "/" + std::to_string(epochs),
                             at.batch + epochSteps, stderr, 100, config_.progress);
    double lossSum = 0.0, epochSeconds = 0.0;
    int64_t lossCount = 0;
    data::Batch batch;
    while (step < totalSteps_) {
      const auto stepStart = Clock::now();
      trace::Scope stepSpan("step", "train");
      stepSpan.index(step);
      {
        trace::Scope dataSpan("data", "data");
        if (!loader.next(batch)) break;
        if (balancer_) batch = shareOf(batch, balancer_->offset(), balancer_->share());
      }
      const double dataSeconds = secondsSince(stepStart);
      checks.beforeStep(step);
      killIfAsked(config_, rank(), step);
      if (step == config_.failStep && rank() == config_.failRank)
        KOLO_THROW(Error, "rank ", rank(), ": failure injected before step ", step,
                   " (--fail-at-step)");
      // --debug-slow-rank RANK:FACTOR (benchmarks, the slow-rank walk-through): that rank
      // takes FACTOR times its compute time, sleeping the difference before each step.
      const double slept = slowRank.sleepBeforeStep();
      const auto computeStart = Clock::now();
      resetPeakTensorBytes();
      const double loss = trainStep(batch, schedule_->lrAt(step));
      stepPeakBytes = std::max(stepPeakBytes, peakTensorBytes());
      stateBytes = liveTensorBytes() - storageBytes(batch.inputs) - storageBytes(batch.labels);
      const double compute = computeSeconds(secondsSince(computeStart), strategy_->reducer());
      slowRank.computed(compute);
      const double seconds = secondsSince(stepStart);
      checks.afterStep(step);
      monitor.record(dataSeconds, seconds, strategy_->reducer());
      if (!std::isfinite(loss))
        KOLO_THROW(DivergedError, "training diverged: loss ", loss, " at step ", step,
                   " (lr ", schedule_->lrAt(step), "); try a smaller --lr");
      ++step;
      if (balancer_) {
        balancer_->record(slept + compute);
        replanWhenDue(*balancer_, *comm_, step, primary, logger_, metrics.get());
      }
      epochSeconds += seconds;
      if (trainSteps + lossCount >= config_.timingSkip) {
        steadySeconds += seconds;
        ++steadySteps;
      }
      lossSum += loss;
      ++lossCount;
      intervalLoss += loss;
      ++intervalSteps;
      status.update("training", step, loss, seconds, globalBatch / std::max(seconds, 1e-9));
      if (const std::optional<IntervalTimes> interval = monitor.endOfStep(step)) {
        breakdown = "  " + interval->progressText();
        if (metrics) {
          observe::Fields fields = interval->fields(config_.algorithm);
          fields.set("wall_s", secondsSince(start));
          fields.set("train_loss", intervalLoss / std::max<int64_t>(intervalSteps, 1));
          fields.set("lr", optimizer().lr());
          metrics->write(fields);
        }
        intervalLoss = 0.0;
        intervalSteps = 0;
      }
      if (config_.checkpointEvery > 0 && step % config_.checkpointEvery == 0) {
        status.update("checkpoint", step);
        saveCheckpoint(step, loader);
        lastCheckpoint = step;
        event("checkpoint", step);
      }
      if (!quiet) {
        char suffix[96];
        std::snprintf(suffix, sizeof(suffix), "loss %.4f  %s samples/s", lossSum / lossCount,
                      formatRate(lossCount * globalBatch / std::max(epochSeconds, 1e-9)).c_str());
        bar.update(at.batch + lossCount, suffix + breakdown);
      }
    }
    KOLO_CHECK(lossCount > 0, "the data loader gave no batch at epoch ", at.epoch, " batch ",
               at.batch);
    // A run stopped by --steps mid-epoch leaves the loader where it is; a full epoch ends
    // with next() returning false, which moves the loader to the next epoch.
    trainSeconds += epochSeconds;
    trainSteps += lossCount;
    summary.trainLoss = lossSum / lossCount;
    status.update("evaluating", step);
    {
      trace::Scope span("evaluate", "train");
      summary.testAccuracy = evaluate();
    }
    evaluated = true;
    summary.epochs = at.epoch + 1;
    const double rate = lossCount * globalBatch / std::max(epochSeconds, 1e-9);
    if (!quiet) {
      char suffix[128];
      std::snprintf(suffix, sizeof(suffix), "loss %.4f  test accuracy %.4f  %s samples/s",
                    summary.trainLoss, summary.testAccuracy, formatRate(rate).c_str());
      bar.finish(suffix);
    }
    if (metrics) {
      metrics->write({{"epoch", at.epoch + 1},
                      {"step", step},
                      {"train_loss", summary.trainLoss},
                      {"test_accuracy", summary.testAccuracy},
                      {"samples_per_s", rate},
                      {"wall_s", secondsSince(start)},
                      {"lr", optimizer().lr()}});
    }
  }
  if (trainSteps > 0)
    logger_.info("tensor memory", {{"rank", rank()},
                                   {"state_bytes", stateBytes - tensorBase_},
                                   {"step_peak_bytes", stepPeakBytes - tensorBase_}});
  if (!evaluated) {
    summary.testAccuracy = evaluate();
    summary.epochs = loader.state().epoch;
  }
  summary.steps = step;
  summary.samplesPerSecond = trainSteps * globalBatch / std::max(trainSeconds, 1e-9);
  summary.steadySamplesPerSecond = steadySteps > 0
                                       ? steadySteps * globalBatch / std::max(steadySeconds, 1e-9)
                                       : summary.samplesPerSecond;
  if (const parallel::Reducer* reducer = strategy_->reducer(); reducer && trainSteps > 0)
    summary.gradBytesPerStep = static_cast<double>(reducer->bytesSent()) / trainSteps;
  if (lastCheckpoint != step && trainSteps > 0) {
    saveCheckpoint(step, loader);
    if (!config_.checkpointDir.empty()) event("checkpoint", step);
  }
  if (!config_.savePath.empty()) strategy_->gatherModel();  // collective under fsdp
  if (primary && !config_.savePath.empty()) {
    checkpoint::saveSafetensors(
        config_.savePath, model().stateDict(),
        {{"format", "pt"}, {"model", config_.model}, {"step", std::to_string(step)}});
    logger_.info("saved weights", {{"file", config_.savePath}});
  }
  summary.wallSeconds = secondsSince(start);
  event("end", step);  // before the final line, which stays the file's last
  if (metrics) {
    metrics->write({{"epoch", summary.epochs},
                    {"step", summary.steps},
                    {"train_loss", summary.trainLoss},
                    {"test_accuracy", summary.testAccuracy},
                    {"samples_per_s", summary.samplesPerSecond},
                    {"steady_samples_per_s", summary.steadySamplesPerSecond},
                    {"grad_bytes_per_step", summary.gradBytesPerStep},
                    {"wall_s", summary.wallSeconds},
                    {"final", true}});
  }
  finishTimeline(comm_.get(), primary, logger_);
  return summary;
}

}  // namespace kolo::cli
