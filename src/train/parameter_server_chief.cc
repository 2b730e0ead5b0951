// The chief of a parameter-server job: resumes the servers from a checkpoint (train::load of
// ParameterServerState), hands out the units of data, and after each epoch evaluates the
// servers' values, checkpoints them (train::save, with the servers quiet) and writes fit's
// metrics and progress lines with the servers' figures; at the end it stops the servers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/trace.h"
#include "train/parameter_server_roles.h"
#include "train/run_lines.h"

namespace kolo::train::detail {
namespace {

using Clock = std::chrono::steady_clock;
namespace ps = parallel::ps;

/// The servers' figures that a metrics line carries.
observe::Fields serverFields(const std::vector<ps::ServerStats>& stats, double seconds) {
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
  dispatch.samplesPerEpoch = job.batchesPerEpoch * options.batch;
  dispatch.lastEpochSamples = job.lastEpochSamples;
  dispatch.unitSamples = options.unitBatches * options.batch;
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

}  // namespace

ParameterServerSummary runChief(const PsJob& job, comm::Store& store,
                                std::shared_ptr<const data::Dataset> validation,
                                const ParameterServerOptions& options,
                                const ParameterServerCallbacks& callbacks,
                                observe::Logger& logger) {
  const auto start = Clock::now();
  const std::vector<std::string> addresses = serverAddresses(store, job);
  auto servers = std::make_shared<ps::ServerGroup>(
      ps::ClientOptions{ps::ClientRole::Chief, 0, ps::Compression::None, job.role.token,
                        job.timeout, options.sharedMemory},
      job.placement, addresses);
  // The checkpoint's staging files go where the checkpoints do, which the servers reach too.
  const std::string staging =
      !options.checkpointDir.empty() ? options.checkpointDir : options.resumeDir;
  ParameterServerState state(servers, job.parameters, staging);
  CheckpointOptions checkpoints{.directory = options.checkpointDir,
                                .keep = options.keepCheckpoints,
                                .communicator = nullptr,
                                .identity = options.identity,
                                .warn = [&logger](const std::string& line) { logger.warn(line); }};
  // Resuming restores the servers before any worker can reach the chief (its address is
  // published below), so every worker's first pull has the checkpoint's values.
  int64_t firstEpoch = 0;
  if (!options.resumeDir.empty()) {
    CheckpointOptions from = checkpoints;
    from.directory = options.resumeDir;
    const Position position = load({&state}, from);
    KOLO_REQUIRE(position.loader.batch == 0, "--resume ", position.path, " was written at batch ",
                 position.loader.batch, " of epoch ", position.loader.epoch + 1,
                 ": parameter servers resume at an epoch's end only");
    KOLO_REQUIRE(position.loader.epoch <= job.epochs, "--resume ", position.path,
                 " is at epoch ", position.loader.epoch, ", past the run's ", job.epochs);
    firstEpoch = position.loader.epoch;
    if (!options.quiet)
      logger.info("resuming", {{"checkpoint", position.path}, {"epoch", firstEpoch},
                               {"step", position.step}});
  }
  ps::DispatchOptions dispatch = dispatchOptions(job, options, store, firstEpoch);
  // A worker lost for missed heartbeats still holds its connections to the servers: the
  // dispatcher's monitor thread tells them over connections of its own.
  std::optional<ps::ServerGroup> drops;
  if (dispatch.heartbeat.count() > 0) {
    drops.emplace(ps::ClientOptions{ps::ClientRole::Chief, 0, ps::Compression::None,
                                    job.role.token, job.timeout, false},  // drops only
                  job.placement, addresses);
    dispatch.onLost = [&drops](int worker) { drops->drop(worker); };
  }
  ps::UnitDispatcher dispatcher(dispatch);
  store.setString(ps::shapeKey(),
                  std::to_string(job.role.servers) + " " + std::to_string(job.role.workers));
  store.setString(ps::chiefAddressKey(), comm::HostPort{dispatch.host, dispatcher.port()}.toString());

  MetricsLog metrics(options.metricsPath, firstEpoch > 0, start);  // a resumed run continues it
  const char* mode = ps::modeName(options.mode);
  int64_t step = job.stepsPerEpoch * firstEpoch;
  metrics.event(firstEpoch > 0 ? "resume" : "start", step,
                {{"ranks", job.role.servers + job.role.workers + 1},
                 {"replicas", job.role.workers},
                 {"strategy", "parameter-server"},
                 {"algorithm", ""},
                 {"batch", options.batch}});
  if (!options.quiet) {
    observe::Fields fields = options.describe;
    fields.update({{"strategy", "parameter-server"},
                   {"ps_mode", mode},
                   {"servers", job.role.servers},
                   {"workers", job.role.workers},
                   {"batch_per_worker", options.batch},
                   {"epochs", job.epochs},
                   {"steps", job.totalSteps}});
    logger.info("training", fields);
  }
  FitSummary summary;
  summary.epochs = firstEpoch;
  double previous = 0.0, seconds = 0.0, steadySamples = 0.0, steadySeconds = 0.0;
  int64_t samples = 0;
  std::optional<EvaluateResult> figures;
  for (int64_t epoch = firstEpoch; epoch < job.epochs; ++epoch) {
    const bool last = epoch + 1 == job.epochs;
    const int64_t epochSteps =
        last ? job.totalSteps - job.stepsPerEpoch * (job.epochs - 1) : job.stepsPerEpoch;
    observe::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(job.epochs),
                             epochSteps, stderr, 100, options.progress);
    const ps::EpochReport done = dispatcher.waitEpoch(epoch);
    if (!options.checkpointDir.empty()) {
      if (last || (options.checkpointEvery > 0 && (epoch + 1) % options.checkpointEvery == 0)) {
        trace::Scope span("checkpoint", "checkpoint");
        const int64_t version = servers->pull(job.parameters);
        const std::string path =
            save({&state}, {.step = version, .loader = {epoch + 1, 0}, .path = ""}, checkpoints);
        logger.debug("checkpoint written", {{"dir", path}, {"epoch", epoch + 1}});
        metrics.event("checkpoint", version);
      }
      dispatcher.releaseEpoch(epoch + 1);
    }
    step = servers->pull(job.parameters);
    if (validation) {
      trace::Scope span("evaluate", "train");
      figures = evaluate(*job.model, *validation);
      summary.validationAccuracy = figures->accuracy;
    }
    summary.trainLoss = done.batches > 0 ? done.lossSum / done.batches : 0.0;
    summary.epochs = epoch + 1;
    const double epochSamples = static_cast<double>(done.batches * options.batch);
    samples += done.batches * options.batch;
    const double rate = epochSamples / std::max(done.seconds - previous, 1e-9);
    // The epochs after this run's first, when every worker has loaded its data and started:
    // the steady rate, as the peers measure theirs (PyTorch's RPC example from each
    // worker's 11th step on).
    if (epoch > firstEpoch) {
      steadySamples += epochSamples;
      steadySeconds += done.seconds - previous;
    }
    previous = seconds = done.seconds;
    const EpochEnd ended{.epoch = epoch + 1, .step = step, .trainLoss = summary.trainLoss,
                         .validation = figures, .samplesPerSecond = rate};
    if (callbacks.onEpochEnd) callbacks.onEpochEnd(ended);
    if (!options.quiet) bar.finish(epochProgressText(summary.trainLoss, figures, rate));
    observe::Fields line = epochFields(
        ended, metrics.wallSeconds(), job.schedule->lrAt(std::clamp<int64_t>(step - 1, 0, job.totalSteps - 1)));
    line.set("ps_mode", mode);
    line.update(serverFields(servers->stats(), seconds));
    line.set("workers_alive", dispatcher.workersAlive());
    line.set("workers_lost", lostFields(dispatcher));
    metrics.write(line);
  }
  dispatcher.waitWorkersFinished();
  // Before the servers stop: a worker that has not connected yet learns the job is over.
  store.setString(ps::finishedKey(), "1");
  summary.steps = servers->pull(job.parameters);
  const std::vector<ps::ServerStats> stats = servers->stats();
  servers->shutdown();
  for (const ps::LostWorker& lost : dispatcher.lost())
    logger.warn("lost a worker; its unit went to the others",
                {{"worker", lost.index}, {"at_s", lost.atSeconds}, {"unit", lost.unit}});
  summary.samplesPerSecond = samples / std::max(seconds, 1e-9);
  summary.steadySamplesPerSecond =
      steadySeconds > 0.0 ? steadySamples / steadySeconds : summary.samplesPerSecond;
  summary.wallSeconds = metrics.wallSeconds();
  const std::vector<int64_t> unitsDone = dispatcher.unitsDone();
  metrics.event("end", summary.steps);  // before the final line, which stays the file's last
  observe::Fields last = finalFields(summary, validation != nullptr);
  last.set("ps_mode", mode);
  last.update(serverFields(stats, seconds));
  last.set("workers_alive", dispatcher.workersAlive());
  last.set("workers_lost", lostFields(dispatcher));
  last.set("units_done", observe::Value::Array(unitsDone.begin(), unitsDone.end()));
  last.set("final", true);
  metrics.write(last);
  return {.role = ps::Role::Chief,
          .index = 0,
          .steps = summary.steps,
          .epochs = summary.epochs,
          .trainLoss = summary.trainLoss,
          .validationAccuracy = summary.validationAccuracy,
          .samplesPerSecond = summary.samplesPerSecond,
          .steadySamplesPerSecond = summary.steadySamplesPerSecond,
          .wallSeconds = summary.wallSeconds,
          .stalenessMax = stalenessMax(stats),
          .workersAlive = dispatcher.workersAlive(),
          .unitsDone = unitsDone};
}

}  // namespace kolo::train::detail
