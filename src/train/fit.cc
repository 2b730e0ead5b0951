// train::fit: the step loop over the engine, built from fit's pieces, each a file with its
// test: the plan (options and length, fit_plan.h), checkpoints and resume
// (fit_checkpoints.h), metrics and progress (fit_records.h), and what stops a run early
// (fit_stopping.h). Under an elastic engine the loop also commits the state after each
// step, admits joiners at step boundaries, recovers from a lost member, and repositions the
// loader for the new shard.
#include "kolo/train/fit.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/trace.h"
#include "kolo/train/elastic.h"
#include "tensor/label_error.h"
#include "train/balance.h"
#include "train/batch_contract.h"
#include "train/fit_checkpoints.h"
#include "train/fit_plan.h"
#include "train/fit_records.h"
#include "train/fit_stopping.h"
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

// The dtype of the model's parameters, which a dataset's floating inputs must have.
std::optional<DType> weightsDtype(Engine& engine) {
  const auto parameters = engine.model().namedParameters();
  if (parameters.empty()) return std::nullopt;
  return parameters.front().second.dtype();
}

}  // namespace

std::string startTimeline(const std::string& directory) {
  return detail::startTimeline(directory);
}

FitSummary fit(Engine& engine, std::shared_ptr<const data::Dataset> train,
               std::shared_ptr<const data::Dataset> validation, const FitOptions& options,
               const FitCallbacks& callbacks) {
  const auto start = Clock::now();
  KOLO_REQUIRE(train != nullptr, "train::fit: no training dataset");
  const detail::FitPlan plan = detail::planFit(options, train->size());
  keepFreedMemory();  // each step reuses the buffers the last one freed
  observe::Logger stderrLogger(stderr);
  observe::Logger& logger = options.logger ? *options.logger : stderrLogger;
  ElasticEngine* elastic = engine.elastic();
  const int64_t globalBatch = options.batch;
  // Who this process is in the job; an elastic engine's membership changes it.
  std::shared_ptr<comm::Communicator> comm;
  bool primary = true;
  parallel::Balancer* balancer = nullptr;
  DataShard shard;
  auto refreshMembership = [&] {
    comm = engine.communicator();
    primary = engine.isPrimary();
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
  std::unique_ptr<optim::LrSchedule> schedule =
      options.schedule ? options.schedule(plan.totalSteps, plan.stepsPerEpoch)
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
  detail::BatchContract contract("the training set", weightsDtype(engine));

  detail::FitCheckpoints checkpoints(engine, options, plan, comm, logger);
  int64_t step = 0;
  const bool joined = elastic && elastic->joinedAt();
  if (joined) {
    // Admitted into a running elastic job: the state came from its members.
    step = *elastic->joinedAt();
    loader->setState(plan.positionOf(step));
  } else if (const std::optional<Position> position = checkpoints.resume(primary)) {
    loader->setState(position->loader);
    step = position->step;
  }
  if (elastic) elastic->commit(step);

  detail::FitRecords records(options, plan, engine, start, step, primary, engine.rank(), logger);
  records.setMembership(comm, primary, shard.worldSize);
  detail::TerminateRequests terminateRequests(options.checkpointOnTerminate && !options.checkpointDir.empty());
  const detail::FailureEvent failureEvent(records.metrics(), step);
  if (!joined) records.announce(step, elastic ? elastic->membershipFields() : observe::Fields{});

  // Elastic: the survivors of a failure (or the members admitting joiners) continue from
  // the state after the steps `recover` or `admitJoiners` returns; fit writes the changes'
  // events, and below the minimum the first survivor saves that state before stopping.
  auto writeElasticEvents = [&] {
    for (const ElasticEvent& event : elastic->takeEvents())
      records.metrics().event(event.name.c_str(), event.step, event.fields);
  };
  auto recoverFrom = [&](const Error& error) -> std::optional<int64_t> {
    comm.reset();  // the survivors' agreement needs the old communicator closed
    checkpoints.setCommunicator(nullptr);
    try {
      return elastic->recover(error, step);
    } catch (const parallel::BelowMinRanksError& stop) {
      if (engine.isPrimary()) checkpoints.saveAlone(stop.change().step, records.metrics());
      throw;
    }
  };
  auto reposition = [&](int64_t at) {
    step = at;
    refreshMembership();
    checkpoints.setCommunicator(comm);
    loader = makeLoader();
    loader->setState(plan.positionOf(at));
    records.setMembership(comm, primary, shard.worldSize);
    writeElasticEvents();
  };
  auto validate = [&]() -> std::optional<EvaluateResult> {
    if (!validation) return std::nullopt;
    trace::Scope span("evaluate", "train");
    return engine.evaluate(*validation);
  };
  auto membershipFields = [&] { return elastic ? elastic->membershipFields() : observe::Fields{}; };

  std::optional<EvaluateResult> lastFigures;
  bool evaluated = false;
  int64_t epochsBegun = 0;
  while (step < plan.totalSteps) {
    const data::LoaderState at = loader->state();
    records.beginEpoch(at, std::min(plan.stepsPerEpoch - at.batch, plan.totalSteps - step));
    std::optional<int64_t> regrouped;  // elastic: the step the new generation continues from
    int64_t stepsThisPass = 0;
    data::Batch batch;
    while (step < plan.totalSteps) {
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
      // Where no reducer times the communication, the time this thread waited in it.
      const double blocked = engine.reducer() ? 0.0 : comm::blockedSeconds() - blockedBefore;
      const double compute =
          std::max(detail::computeSeconds(secondsSince(computeStart), engine.reducer()) - blocked, 0.0);
      const double seconds = secondsSince(stepStart);
      StepFigures stepFigures{.computeSeconds = compute, .peakStepBytes = peakBytes - bytesBeforeStep};
      engine.refineStepFigures(stepFigures);
      records.recordStep(stepFigures, seconds, peakBytes,
                         liveTensorBytes() - storageBytes(batch.inputs) - storageBytes(batch.labels),
                         dataSeconds, blocked);
      detail::checkStep(options, engine, comm.get(), step, loss, lr);
      if (callbacks.onStepEnd)
        callbacks.onStepEnd({.step = step, .loss = loss, .lr = lr, .seconds = seconds,
                             .computeSeconds = compute, .batch = &batch});
      ++step;
      ++stepsThisPass;
      if (elastic) {
        elastic->commit(step);
        writeElasticEvents();
      }
      records.stepDone(step, loss, seconds);
      std::optional<detail::IntervalTimes> interval;
      bool terminate = false;
      try {
        terminate = terminateRequests.agreed(comm.get());
        if (balancer) {
          balancer->record(beginSeconds + compute);
          detail::replanWhenDue(*balancer, *comm, step, primary, logger, records.metrics().writer());
        }
        interval = records.endOfStep(step);
      } catch (const Error& error) {
        if (!elastic || !(regrouped = recoverFrom(error))) throw;
        break;
      }
      if (interval) records.writeInterval(*interval, membershipFields());
      if (terminate || checkpoints.due(step)) {
        records.status().update("checkpoint", step);
        checkpoints.save(step, records.metrics(), primary);
      }
      if (terminate) {
        logger.warn("SIGTERM: stopping after the checkpoint of this step",
                    {{"step", step}, {"dir", options.checkpointDir}});
        records.metrics().event("failed", step, {{"signal", "SIGTERM"}});
        terminateRequests.terminate();
      }
      records.showProgress(stepsThisPass);
    }
    if (regrouped) {
      reposition(*regrouped);
      continue;
    }
    KOLO_CHECK(stepsThisPass > 0 || at.batch > 0, "the data loader gave no batch at epoch ",
               at.epoch, " batch ", at.batch);
    // A run stopped by `steps` mid-epoch leaves the loader where it is; a full epoch ends
    // with next() returning false, which moves the loader to the next epoch.
    records.status().update("evaluating", step);
    lastFigures = validate();
    evaluated = true;
    epochsBegun = at.epoch + 1;
    const EpochEnd ended = records.endEpoch(at, step, lastFigures);
    if (callbacks.onEpochEnd) callbacks.onEpochEnd(ended);
    records.writeEpoch(ended);
  }
  if (elastic && primary) elastic->finish();  // ranks still waiting to join stop waiting
  if (!evaluated) {
    lastFigures = validate();
    epochsBegun = loader->state().epoch;
  }
  if (records.trainSteps() > 0) checkpoints.saveAtEnd(step, records.metrics(), primary);
  FitSummary summary = records.summarize(step, comm.get());
  summary.epochs = epochsBegun;
  if (lastFigures) {
    summary.validationAccuracy = lastFigures->accuracy;
    summary.validationLoss = lastFigures->loss;
  }
  // The engine owns its model; the summary's handle is valid while the engine lives.
  summary.model = std::shared_ptr<nn::Module>(std::shared_ptr<nn::Module>(), &engine.model());
  summary.wallSeconds = secondsSince(start);
  observe::Fields extra = membershipFields();
  if (callbacks.onEnd) extra.update(callbacks.onEnd(summary));
  records.writeEnd(summary, validation != nullptr, extra);
  if (options.finishTimeline) detail::finishTimeline(comm.get(), primary, logger);
  return summary;
}

}  // namespace kolo::train
