// The chief of a parameter-server job: resumes the servers from a checkpoint (train::load of
// ParameterServerState), hands out the units of data, and after each epoch evaluates the
// servers' values, checkpoints them (train::save, with the servers quiet) and writes fit's
// metrics and progress lines with the servers' figures; at the end it stops the servers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "parallel/ps/store_keys.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/trace.h"
#include "train/parameter_server_roles.h"
#include "train/resume.h"
#include "train/run_lines.h"

namespace kolo::train::detail {
namespace {

using Clock = std::chrono::steady_clock;
namespace ps = parallel::ps;

/// The servers' figures that a metrics line carries.
observe::Fields serverStatsFields(const std::vector<ps::ServerStats>& stats, double seconds) {
  int64_t updates = 0, pushes = 0, bytes = 0, stalenessMax = 0, stalenessSum = 0, shared = 0;
  int64_t inPlace = 0;
  for (const ps::ServerStats& s : stats) {
    shared += s.sharedWorkers;
    inPlace += s.valuesInPlace;
    updates = std::max(updates, s.updates);
    pushes += s.pushes;
    bytes += s.bytesIn + s.bytesOut;
    stalenessMax = std::max(stalenessMax, s.stalenessMax);
    stalenessSum += s.stalenessSum;
  }
  const double perServer = stats.empty() ? 0.0 : static_cast<double>(pushes) / stats.size();
  return {{"updates", updates},
          {"staleness_max", stalenessMax},
          {"staleness_mean", pushes > 0 ? static_cast<double>(stalenessSum) / pushes : 0.0},
          {"pushes_per_s", perServer / std::max(seconds, 1e-9)},
          {"bytes_per_s", static_cast<double>(bytes) / std::max(seconds, 1e-9)},
          {"ps_shared_memory", shared},
          {"ps_values_in_place", inPlace}};
}

int64_t stalenessMax(const std::vector<ps::ServerStats>& stats) {
  int64_t most = 0;
  for (const ps::ServerStats& s : stats) most = std::max(most, s.stalenessMax);
  return most;
}

observe::Value::Array lostFields(const ps::UnitDispatcher& dispatcher) {
  observe::Value::Array list;
  for (const ps::LostWorker& lost : dispatcher.lost())
    list.push_back(observe::Fields{{"worker", lost.index},
                                   {"at_s", lost.atSeconds},
                                   {"unit", lost.unit},
                                   {"cause", lost.heartbeat ? "heartbeat" : "connection"}});
  return list;
}

/// The dispatcher's settings for this job, from epoch `firstEpoch` on.
ps::DispatchOptions dispatchOptions(const PsJob& job, const ParameterServerOptions& options,
                                    comm::Store& store, int64_t firstEpoch) {
  ps::DispatchOptions dispatch;
  dispatch.workers = job.role.workers;
  dispatch.samplesPerEpoch = job.batchesPerEpoch * job.workerBatch;
  dispatch.lastEpochSamples = job.lastEpochSamples;
  dispatch.unitSamples = options.unitBatches * job.workerBatch;
  // A sync round takes a push from every worker still in the rounds, and a worker waiting
  // for a unit sits the rounds out: the W workers, which push in step, take the epoch's units
  // W alike at a time (its last W shorter), so that none holds a unit that the others do not
  // match and pushes rounds alone, past the plan's steps.
  if (options.mode == ps::Mode::Sync) dispatch.unitsAlike = job.role.workers;
  dispatch.epochs = job.epochs;
  dispatch.token = job.role.token;
  dispatch.host = ps::localHost(store);
  dispatch.timeout = job.timeout;
  dispatch.firstEpoch = firstEpoch;
  // Checkpoints are taken between epochs, with the servers quiet: the next epoch's units
  // wait until the checkpoint is written.
  dispatch.pauseBetweenEpochs = !options.checkpointDir.empty();
  dispatch.heartbeat = options.heartbeat;
  return dispatch;
}

/// The chief's run: its connections, the dispatcher, the records, and the figures so far.
class Chief {
 public:
  Chief(const PsJob& job, comm::Store& store, std::shared_ptr<const data::Dataset> validation,
        const ParameterServerOptions& options, const ParameterServerCallbacks& callbacks,
        observe::Logger& logger, RankStatus& status)
      : job_(job),
        store_(store),
        validation_(std::move(validation)),
        options_(options),
        callbacks_(callbacks),
        logger_(logger),
        status_(status),
        addresses_(serverAddresses(store, job)),
        servers_(std::make_shared<ps::ServerGroup>(
            ps::ClientOptions{ps::ClientRole::Chief, 0, ps::Compression::None, job.role.token,
                              job.timeout, options.sharedMemory},
            job.placement, addresses_)),
        // The staging files go where the checkpoints are, which the servers reach too.
        state_(servers_, job.parameters,
               options.checkpointDir.empty() ? options.resumeDir : options.checkpointDir,
               job.model->namedBuffers()),
        checkpoints_{.directory = options.checkpointDir,
                     .keep = options.keepCheckpoints,
                     .communicator = nullptr,
                     .identity = identityOf(options),
                     .warn = [&logger](const std::string& line) { logger.warn(line); }} {}

  ParameterServerSummary run() {
    // Resuming restores the servers before any worker can reach the chief (its address is
    // published by startDispatching), so every worker's first pull has the checkpoint's values.
    const std::string resumeDir = resumeDirectory(options_.resumeDir, options_.checkpointDir);
    const int64_t firstEpoch = resumeDir.empty() ? 0 : resume(resumeDir);
    // Before the workers can reach the chief: they start from the checkpoint's buffers.
    startBuffers_ = packBuffers(*job_.model);
    if (firstEpoch > 0 && hasBuffers_) store_.set(ps::startBuffersKey(), startBuffers_);
    startDispatching(firstEpoch);
    metrics_ = std::make_unique<MetricsLog>(options_.metricsPath, firstEpoch > 0, start_);
    step_ = job_.stepsPerEpoch * firstEpoch;
    const FailureEvent failureEvent(*metrics_, step_);
    announce(firstEpoch);
    status_.setEpoch(firstEpoch + 1);
    status_.update("dispatching", step_);
    summary_.epochs = firstEpoch;
    for (int64_t epoch = firstEpoch; epoch < job_.epochs; ++epoch) runEpoch(epoch, firstEpoch);
    return finish();
  }

 private:
  /// Restores the servers from the newest checkpoint of `directory` (any strategy's, at an
  /// epoch's end); returns the epochs it had done.
  int64_t resume(const std::string& directory) {
    CheckpointOptions from = checkpoints_;
    from.directory = directory;
    Position position = loadFrom({&state_}, from, "ParameterServerOptions::resumeDir");
    // A checkpoint written before an epoch's end was recorded as the next epoch's start may
    // say "after the last batch of epoch e": that is epoch e + 1's start (the identity has
    // made sure the batch, and so the steps of an epoch, are this run's).
    if (position.loader.batch == job_.stepsPerEpoch) position.loader = {position.loader.epoch + 1, 0};
    KOLO_REQUIRE(position.loader.batch == 0, "ParameterServerOptions::resumeDir ", position.path,
                 " was written at step ", position.loader.batch, " of epoch ",
                 position.loader.epoch + 1, " (", job_.stepsPerEpoch,
                 " steps an epoch): parameter servers resume at an epoch's end only");
    KOLO_REQUIRE(position.loader.epoch <= job_.epochs, "ParameterServerOptions::resumeDir ",
                 position.path, " is at epoch ", position.loader.epoch, ", past the run's ",
                 job_.epochs);
    logger_.info("resuming", {{"checkpoint", position.path},
                              {"epoch", position.loader.epoch},
                              {"step", position.step}});
    return position.loader.epoch;
  }

  /// Starts the dispatcher and publishes its address (and the job's shape) for the workers.
  void startDispatching(int64_t firstEpoch) {
    ps::DispatchOptions dispatch = dispatchOptions(job_, options_, store_, firstEpoch);
    // A worker lost for missed heartbeats still holds its connections to the servers: the
    // dispatcher's monitor thread tells them over connections of its own.
    if (dispatch.heartbeat.count() > 0) {
      drops_.emplace(ps::ClientOptions{ps::ClientRole::Chief, 0, ps::Compression::None,
                                       job_.role.token, job_.timeout, false},  // drops only
                     job_.placement, addresses_);
      dispatch.onLost = [this](int worker) { drops_->drop(worker); };
    }
    dispatcher_ = std::make_unique<ps::UnitDispatcher>(dispatch);
    store_.setString(ps::shapeKey(), std::to_string(job_.role.servers) + " " +
                                         std::to_string(job_.role.workers));
    store_.setString(ps::chiefAddressKey(),
                     comm::HostPort{dispatch.host, dispatcher_->port()}.toString());
  }

  /// The start (or resume) event and the "training" log line.
  void announce(int64_t firstEpoch) {
    metrics_->event(firstEpoch > 0 ? "resume" : "start", step_,
                    {{"ranks", job_.role.servers + job_.role.workers + 1},
                     {"replicas", job_.role.workers},
                     {"strategy", "parameter-server"},
                     {"algorithm", ""},
                     {"batch", options_.batch}});
    observe::Fields fields = options_.describe;
    fields.update({{"strategy", "parameter-server"},
                   {"ps_mode", ps::modeName(options_.mode)},
                   {"servers", job_.role.servers},
                   {"workers", job_.role.workers},
                   {"batch", options_.batch},
                   {"worker_batch", job_.workerBatch},
                   {"epochs", job_.epochs},
                   {"steps", job_.totalSteps}});
    logger_.info("training", fields);
  }

  /// Waits for `epoch`'s units, checkpoints (the servers quiet) when due, lets the next epoch
  /// go, evaluates and writes the epoch's lines.
  void runEpoch(int64_t epoch, int64_t firstEpoch) {
    const bool last = epoch + 1 == job_.epochs;
    const int64_t epochSteps =
        last ? job_.totalSteps - job_.stepsPerEpoch * (job_.epochs - 1) : job_.stepsPerEpoch;
    observe::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(job_.epochs),
                             epochSteps, stderr, 100, options_.progress);
    status_.setEpoch(epoch + 1);
    const ps::EpochReport done = dispatcher_->waitEpoch(epoch);
    if (!options_.checkpointDir.empty()) {
      // checkpointEvery counts steps, as fit's; the servers are quiet between epochs only, so
      // a multiple of it reached during the epoch is checkpointed at the epoch's end.
      const int64_t every = options_.checkpointEvery;
      const int64_t before = job_.stepsPerEpoch * epoch, after = before + epochSteps;
      if (last || (every > 0 && after / every > before / every)) checkpoint(epoch + 1);
      dispatcher_->releaseEpoch(epoch + 1);
    }
    step_ = servers_->pull(job_.parameters);
    takeWorkersBuffers();
    if (validation_) {
      trace::Scope span("evaluate", "train");
      status_.update("evaluating", step_);
      figures_ = evaluate(*job_.model, *validation_);
      summary_.validationAccuracy = figures_->accuracy;
      summary_.validationLoss = figures_->loss;
    }
    summary_.trainLoss = done.batches > 0 ? done.lossSum / done.batches : 0.0;
    summary_.epochs = epoch + 1;
    const double epochSamples = static_cast<double>(done.batches * job_.workerBatch);
    samples_ += done.batches * job_.workerBatch;
    const double secondsBefore = seconds_;
    const double rate = epochSamples / std::max(done.seconds - seconds_, 1e-9);
    // The epochs after this run's first, when every worker has loaded its data and started:
    // the steady rate, as the peers measure theirs (PyTorch's RPC example from each
    // worker's 11th step on).
    if (epoch > firstEpoch) {
      steadySamples_ += epochSamples;
      steadySeconds_ += done.seconds - seconds_;
    }
    seconds_ = done.seconds;
    const EpochEnd ended{.epoch = epoch + 1, .step = step_, .trainLoss = summary_.trainLoss,
                         .validation = figures_, .samplesPerSecond = rate};
    status_.update("dispatching", step_, summary_.trainLoss,
                   (done.seconds - secondsBefore) / std::max<int64_t>(epochSteps, 1), rate);
    if (callbacks_.onEpochEnd) callbacks_.onEpochEnd(ended);
    if (!options_.quiet) bar.finish(epochProgressText(summary_.trainLoss, figures_, rate));
    const double lr = job_.schedule->lrAt(std::clamp<int64_t>(step_ - 1, 0, job_.totalSteps - 1));
    observe::Fields line = epochFields(ended, metrics_->wallSeconds(), lr);
    line.update(serverFields(servers_->stats()));
    metrics_->write(line);
  }

  /// train::save of the servers' state after `epochs` epochs.
  void checkpoint(int64_t epochs) {
    trace::Scope span("checkpoint", "checkpoint");
    const int64_t version = servers_->pull(job_.parameters);
    takeWorkersBuffers();
    status_.update("checkpoint", version);
    const std::string path =
        save({&state_}, {.step = version, .loader = {epochs, 0}, .path = ""}, checkpoints_);
    logger_.debug("checkpoint written", {{"dir", path}, {"epoch", epochs}});
    metrics_->event("checkpoint", version);
  }

  /// The model's buffers become the workers' mean (parameter_server_roles.h), when it has any.
  void takeWorkersBuffers() {
    if (hasBuffers_)
      averageBuffers(store_, job_.role.workers, job_.timeout, startBuffers_, *job_.model);
  }

  /// The fields every metrics line adds: the servers' figures and the workers'.
  observe::Fields serverFields(const std::vector<ps::ServerStats>& stats) const {
    observe::Fields fields{{"ps_mode", ps::modeName(options_.mode)}};
    fields.update(serverStatsFields(stats, seconds_));
    fields.set("workers_alive", dispatcher_->workersAlive());
    fields.set("workers_lost", lostFields(*dispatcher_));
    return fields;
  }

  /// Ends the job (every worker told, then the servers stopped) and writes the final line.
  ParameterServerSummary finish() {
    dispatcher_->waitWorkersFinished();
    // Before the servers stop: a worker that has not connected yet learns the job is over.
    store_.setString(ps::finishedKey(), "1");
    summary_.steps = step_ = servers_->pull(job_.parameters);
    takeWorkersBuffers();
    const std::vector<ps::ServerStats> stats = servers_->stats();
    servers_->shutdown();
    for (const ps::LostWorker& lost : dispatcher_->lost())
      logger_.warn("lost a worker; its unit went to the others",
                   {{"worker", lost.index}, {"at_s", lost.atSeconds}, {"unit", lost.unit}});
    summary_.samplesPerSecond = samples_ / std::max(seconds_, 1e-9);
    summary_.steadySamplesPerSecond =
        steadySeconds_ > 0.0 ? steadySamples_ / steadySeconds_ : summary_.samplesPerSecond;
    summary_.wallSeconds = metrics_->wallSeconds();
    const std::vector<int64_t> unitsDone = dispatcher_->unitsDone();
    metrics_->event("end", summary_.steps);  // before the final line, which stays the last
    observe::Fields last = finalFields(summary_, validation_ != nullptr);
    last.update(serverFields(stats));
    last.set("units_done", observe::Value::Array(unitsDone.begin(), unitsDone.end()));
    last.set("final", true);
    metrics_->write(last);
    ParameterServerSummary summary;
    static_cast<FitSummary&>(summary) = summary_;
    summary.model = job_.model;  // the last pull left the servers' final values in it
    summary.role = ps::Role::Chief;
    summary.index = 0;
    summary.stalenessMax = stalenessMax(stats);
    summary.workersAlive = dispatcher_->workersAlive();
    summary.unitsDone = unitsDone;
    return summary;
  }

  const PsJob& job_;
  comm::Store& store_;
  std::shared_ptr<const data::Dataset> validation_;
  const ParameterServerOptions& options_;
  const ParameterServerCallbacks& callbacks_;
  observe::Logger& logger_;
  RankStatus& status_;
  const Clock::time_point start_ = Clock::now();
  const bool hasBuffers_ = !job_.model->namedBuffers().empty();
  comm::Bytes startBuffers_;  // the buffers every worker started from
  std::vector<std::string> addresses_;
  std::shared_ptr<ps::ServerGroup> servers_;
  ParameterServerState state_;
  CheckpointOptions checkpoints_;
  std::optional<ps::ServerGroup> drops_;                // declared before the dispatcher,
  std::unique_ptr<ps::UnitDispatcher> dispatcher_;      // whose monitor thread uses it
  std::unique_ptr<MetricsLog> metrics_;
  int64_t step_ = 0;
  FitSummary summary_;
  std::optional<EvaluateResult> figures_;
  int64_t samples_ = 0;
  double seconds_ = 0.0;  // when the last epoch's last unit was reported
  double steadySamples_ = 0.0, steadySeconds_ = 0.0;
};

}  // namespace

ParameterServerSummary runChief(const PsJob& job, comm::Store& store,
                                std::shared_ptr<const data::Dataset> validation,
                                const ParameterServerOptions& options,
                                const ParameterServerCallbacks& callbacks,
                                observe::Logger& logger, RankStatus& status) {
  return Chief(job, store, std::move(validation), options, callbacks, logger, status).run();
}

}  // namespace kolo::train::detail
