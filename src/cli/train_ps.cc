// `kolo train --strategy parameter-server`: the three roles of a job started by kolo run --ps
// P --workers W. Every process builds the same seeded model and placement; servers take
// their slices and serve; workers ask the chief for units of data, push a gradient per batch
// and take the values they get back; the chief evaluates after each epoch, writes metrics,
// the final weights and the summary line, and stops the servers at the end.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <thread>

#include "cli/train_loop.h"
#include "cli/train_ps_checkpoint.h"
#include "comm/token.h"
#include "kolo/autograd.h"
#include "kolo/checkpoint.h"
#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/parameter_server.h"
#include "kolo/safetensors.h"
#include "kolo/settings.h"
#include "kolo/train/evaluate.h"
#include "launch/launcher.h"

namespace kolo::cli {
namespace {

using Clock = std::chrono::steady_clock;
namespace ps = parallel::ps;

/// What every role derives the same way from the flags.
struct PsPlan {
  ps::RoleInfo role;
  ps::Mode mode = ps::Mode::Sync;
  std::shared_ptr<nn::Module> model;
  parallel::NamedTensors parameters;
  ps::Placement placement;
  Recipe recipe;
  double lookahead = 0.0;  // --ps-lookahead, or its default, where the exchange is overlapped
  bool lookaheadAsked = false;  // a --ps-lookahead other than 0 given
  int64_t samplesPerEpoch = 0;
  int64_t updatesPerEpoch = 0;
  int64_t totalUpdates = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::optional<PsCheckpoint> resume;  // --resume: the newest complete checkpoint
};

constexpr int64_t kDefaultWorkerBatch = 64;

/// async and ssp without --optimizer, --lr, --momentum or --nesterov: Adam at 1e-3 with a
/// cosine schedule, and where the exchange is overlapped, a look-ahead of 1.5. Adam's
/// per-element scaling copes with stale gradients; the one-device default, Nesterov SGD with
/// momentum 0.9, adds to the momentum staleness brings of its own and reached 0.68 test
/// accuracy in three epochs with three workers. Overlapped, the look-ahead took that job from
/// 0.859 to 0.862 test accuracy (mean of six seeds; docs/parameter_server.md).
bool adamDefaults(const TrainConfig& config, ps::Mode mode) {
  return mode != ps::Mode::Sync && !config.optimizer && !config.lr && !config.momentum &&
         !config.nesterov;
}

TrainConfig withModeDefaults(TrainConfig config, ps::Mode mode) {
  if (!adamDefaults(config, mode)) return config;
  config.optimizer = "adam";
  config.lr = 1e-3;
  if (config.schedule == "auto") config.schedule = "cosine";
  return config;
}

PsPlan makePlan(const TrainConfig& given, int64_t trainSize) {
  PsPlan plan;
  const TrainConfig config = withModeDefaults(given, ps::parseMode(given.psMode));
  plan.role = ps::roleFromEnvironment();
  plan.mode = ps::parseMode(config.psMode);
  ps::parseCompression(config.psCompress);
  KOLO_REQUIRE(config.steps == 0,
               "--steps is not available with --strategy parameter-server: "
               "use --epochs (and --train-limit)");
  KOLO_REQUIRE(config.clipNorm == 0.0,
               "--clip-norm is not available with --strategy "
               "parameter-server");
  refuseReducerFlags(config, "--strategy parameter-server",
                     " (its workers compress with --ps-compress fp16|bf16)");
  const int64_t batches = trainSize / config.batch;
  KOLO_REQUIRE(batches > 0, "--batch ", config.batch, " is larger than the ", trainSize,
               " training samples");
  plan.samplesPerEpoch = batches * config.batch;
  const int workers = plan.role.workers;
  plan.updatesPerEpoch = plan.mode == ps::Mode::Sync ? (batches + workers - 1) / workers : batches;
  plan.recipe = resolveRecipe(config, plan.updatesPerEpoch);
  plan.lookaheadAsked = config.psLookahead.value_or(0.0) != 0.0;
  plan.lookahead = config.psLookahead.value_or(adamDefaults(given, plan.mode) ? 1.5 : 0.0);
  plan.totalUpdates = plan.recipe.epochs * plan.updatesPerEpoch;
  Generator generator(config.seed);
  plan.model = nn::makeModel(config.model, generator);
  if (!config.initPath.empty())
    checkpoint::loadSafetensorsInto(config.initPath, plan.model->stateDict());
  plan.parameters = plan.model->namedParameters();
  plan.placement = ps::placeParameters(plan.parameters, plan.role.servers, config.psShardBytes);
  if (const auto seconds = settings::timeout())
    plan.timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  if (!config.resumeDir.empty()) {
    std::vector<PsCheckpoint> found = completeCheckpoints(config.resumeDir);
    if (found.empty())
      KOLO_THROW(FileError, "--resume ", config.resumeDir,
                 ": no complete parameter-server "
                 "checkpoint there (epoch-*/chief.json)");
    plan.resume = std::move(found.back());
    const nlohmann::json identity = jobIdentity(config, plan.role.servers);
    for (const auto& [key, value] : identity.items()) {
      if (plan.resume->chief.value(key, nlohmann::json()) != value)
        KOLO_THROW(Mismatch, "--resume ", plan.resume->path, ": the checkpoint was written with ",
                   key, " ", plan.resume->chief.value(key, nlohmann::json()).dump(),
                   ", this run has ", value.dump());
    }
    KOLO_REQUIRE(plan.resume->epoch <= plan.recipe.epochs, "--resume ", plan.resume->path,
                 " is at epoch ", plan.resume->epoch, ", past --epochs ", plan.recipe.epochs);
  }
  return plan;
}

std::vector<std::string> serverAddresses(comm::Store& store, const PsPlan& plan) {
  std::vector<std::string> addresses;
  for (int s = 0; s < plan.role.servers; ++s)
    addresses.push_back(store.getString(ps::serverAddressKey(s), plan.timeout));
  return addresses;
}


std::chrono::milliseconds heartbeatOf(const TrainConfig& config) {
  return std::chrono::milliseconds(static_cast<int64_t>(config.psHeartbeatSeconds * 1000));
}

int runServer(const TrainConfig& config, const PsPlan& plan, comm::Store& store) {
  ps::ServerOptions options;
  options.index = plan.role.index;
  options.workers = plan.role.workers;
  options.mode = plan.mode;
  options.staleness = config.staleness;
  options.stalenessLr = config.psStalenessLr == "on" ||
                        (config.psStalenessLr == "auto" && plan.mode != ps::Mode::Sync);
  options.token = plan.role.token;
  options.host = ps::localHost(store);
  options.timeout = plan.timeout;
  if (plan.resume)
    options.restoreFrom =
        plan.resume->path + "/server-" + std::to_string(plan.role.index) + ".safetensors";
  std::shared_ptr<optim::LrSchedule> schedule = makeSchedule(plan.recipe, plan.totalUpdates);
  const Recipe recipe = plan.recipe;
  ps::ParameterServer server(
      options, plan.placement, plan.parameters,
      [recipe](const parallel::NamedTensors& slices) { return makeOptimizer(recipe, slices); },
      [schedule](int64_t update) { return schedule->lrAt(update); });
  store.setString(ps::serverAddressKey(plan.role.index),
                  comm::HostPort{options.host, server.port()}.toString());
  server.serve();
  return 0;
}

/// Whether a worker overlaps its exchange with the next step's compute: --ps-overlap, auto
/// meaning in async and ssp (sync keeps synchronous training's math) when some server is
/// reached over TCP, or when --ps-lookahead asks for it. Overlap hides the network's time
/// behind the next step; through shared memory on the server's host there is none to hide,
/// and the second replica only makes gradients staler and takes the cores the job shares:
/// on one host async was as fast or faster without it, and 0.6-1 point more accurate
/// (docs/parameter_server.md).
bool overlapOf(const TrainConfig& config, const PsPlan& plan, const ps::ServerGroup& servers) {
  const ps::Mode mode = plan.mode;
  if (config.psOverlap == "auto")
    return mode != ps::Mode::Sync &&
           (plan.lookaheadAsked || servers.sharedServers() < plan.role.servers);
  KOLO_REQUIRE(config.psOverlap == "off" || mode != ps::Mode::Sync,
               "--ps-overlap on is not available with --ps-mode sync: a round's mean must be of "
               "gradients computed on the same parameters");
  return config.psOverlap == "on";
}

/// Whether the chief has marked the job over (a store that is gone counts as not).
bool jobFinished(comm::Store& store) {
  try {
    return store.check({ps::finishedKey()});
  } catch (const Error&) {
    return false;
  }
}

/// A worker that starts late (its node slow to start, its data slow to load on a busy
/// machine) may find that the others did every unit and the chief ended the job, its servers
/// gone: it has nothing left to do, which is not a failure.
int lateWorker(const PsPlan& plan) {
  std::fprintf(stderr,
               "worker %d: the job finished before this worker connected; nothing left to do\n",
               plan.role.index);
  return 0;
}

int runWorker(const TrainConfig& config, const PsPlan& plan, comm::Store& store,
              const data::TensorDataset& train, observe::Logger& logger) {
  if (jobFinished(store)) return lateWorker(plan);
  std::optional<ps::ServerGroup> connected;
  std::optional<ps::UnitClient> chief;
  try {
    connected.emplace(ps::ClientOptions{ps::ClientRole::Worker, plan.role.index,
                                        ps::parseCompression(config.psCompress), plan.role.token,
                                        plan.timeout, config.psTransport != "tcp"},
                      plan.placement, serverAddresses(store, plan));
    chief.emplace(store.getString(ps::chiefAddressKey(), plan.timeout), plan.role.index,
                  plan.role.token, plan.timeout, heartbeatOf(config));
  } catch (const Error&) {
    // The chief ended the job while this worker read the addresses or connected.
    if (jobFinished(store)) return lateWorker(plan);
    throw;
  }
  ps::ServerGroup& servers = *connected;
  ps::UnitClient& units = *chief;
  // Overlapped, a second replica of the model computes while the first one's exchange runs.
  std::vector<std::shared_ptr<nn::Module>> models = {plan.model};
  std::vector<parallel::NamedTensors> replicas = {plan.parameters};
  const bool overlapped = overlapOf(config, plan, servers);
  if (overlapped) {
    Generator generator(config.seed);
    models.push_back(nn::makeModel(config.model, generator));
    replicas.push_back(models.back()->namedParameters());
  }
  for (const auto& model : models) model->train(true);
  KOLO_REQUIRE(!plan.lookaheadAsked || overlapped,
               "--ps-lookahead needs the exchange overlapped (--ps-overlap, async and ssp)");
  ps::WorkerExchange exchange(servers, replicas, overlapped ? plan.lookahead : 0.0);
  if (!config.quiet)
    logger.info("worker exchange", {{"worker", plan.role.index},
                                    {"overlapped", overlapped},
                                    {"lookahead", overlapped ? plan.lookahead : 0.0},
                                    {"servers_in_shared_memory", servers.sharedServers()}});
  // Tests: a worker whose launch rank is in --debug-kill-rank SIGKILLs itself before its push
  // number --debug-kill-rank's STEP (counted from 0), mid-epoch at a point of the test's choosing.
  int64_t pushes = 0;
  exchange.pull();
  bool idle = false;
  int64_t orderEpoch = -1;
  std::vector<int64_t> order;
  ps::UnitReport report;
  for (;;) {
    // Waiting for a unit, this worker must not hold back the others' rounds (sync) or
    // count as the slowest (ssp): it leaves until its next push.
    const std::optional<ps::Unit> unit = units.next(report, [&] {
      servers.leave();
      idle = true;
    });
    if (!unit) break;
    if (unit->end > train.size())
      KOLO_THROW(FormatError, "the chief handed worker ", plan.role.index, " samples [",
                 unit->begin, ", ", unit->end, ") of a training set of ", train.size());
    if (idle) exchange.pull();
    idle = false;
    if (unit->epoch != orderEpoch) {
      orderEpoch = unit->epoch;
      if (config.shuffle) {
        order = data::epochPermutation(train.size(), config.seed, orderEpoch);
      } else {
        order.resize(static_cast<size_t>(train.size()));
        std::iota(order.begin(), order.end(), 0);
      }
    }
    report = ps::UnitReport{unit->id, 0.0, 0};
    for (int64_t at = unit->begin; at < unit->end; at += config.batch) {
      const std::vector<int64_t> indices(order.begin() + at,
                                         order.begin() + std::min(at + config.batch, unit->end));
      const auto stepStart = Clock::now();
      const data::Batch batch = train.gather(indices);
      nn::Module& model = *models[static_cast<size_t>(exchange.current())];
      for (auto& [name, p] : replicas[static_cast<size_t>(exchange.current())]) {
        Tensor handle = p;
        handle.zeroGrad();
      }
      Tensor loss = crossEntropy(model.forward(batch.inputs), batch.labels);
      loss.backward();
      const double value = loss.item();
      if (!std::isfinite(value))
        KOLO_THROW(DivergedError, "worker ", plan.role.index, ": loss ", value, " in epoch ",
                   unit->epoch + 1, "; try a smaller --lr");
      if (plan.role.index == config.slowWorker)
        std::this_thread::sleep_for((Clock::now() - stepStart) * (config.slowFactor - 1.0));
      killIfAsked(config, static_cast<int>(settings::rank().value_or(-1)), pushes++);
      exchange.pushAndSwap();
      report.lossSum += value;
      ++report.batches;
    }
    // A unit reported done has every push answered: the chief evaluates, checkpoints and
    // ends the job on that.
    exchange.settle();
  }
  // The chief stops the servers once every worker has been told the job is over, so they
  // may already be gone: leaving is a courtesy.
  try {
    servers.leave();
  } catch (const Error&) {
  }
  return 0;
}

int64_t stalenessMax(const std::vector<ps::ServerStats>& stats) {
  int64_t most = 0;
  for (const ps::ServerStats& s : stats) most = std::max(most, s.stalenessMax);
  return most;
}

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

/// Writes the checkpoint after `epochs` epochs (the servers are quiet), then drops the
/// oldest complete ones beyond --keep-checkpoints.
void writeCheckpoint(const TrainConfig& config, const PsPlan& plan, ps::ServerGroup& servers,
                     int64_t epochs, observe::Logger& logger) {
  const std::string directory = checkpointDirectory(config.checkpointDir, epochs);
  std::filesystem::create_directories(directory);
  servers.checkpoint(directory);
  nlohmann::json chief = jobIdentity(config, plan.role.servers);
  chief["epoch"] = epochs;
  chief["ps_mode"] = ps::modeName(plan.mode);
  chief["workers"] = plan.role.workers;
  completeCheckpoint(directory, chief);
  logger.debug("checkpoint written", {{"dir", directory}, {"epoch", epochs}});
  dropOldCheckpoints(config.checkpointDir, config.keepCheckpoints);
}

int runChief(const TrainConfig& config, const PsPlan& plan, comm::Store& store,
             observe::Logger& logger) {
  const auto start = Clock::now();
  ps::DispatchOptions dispatch;
  dispatch.workers = plan.role.workers;
  dispatch.samplesPerEpoch = plan.samplesPerEpoch;
  dispatch.unitSamples = config.psUnitBatches * config.batch;
  dispatch.epochs = plan.recipe.epochs;
  dispatch.token = plan.role.token;
  dispatch.host = ps::localHost(store);
  dispatch.timeout = plan.timeout;
  const int64_t firstEpoch = plan.resume ? plan.resume->epoch : 0;
  dispatch.firstEpoch = firstEpoch;
  // Checkpoints are taken between epochs, with the servers quiet: the next epoch's units
  // wait until the servers' files are written.
  const bool checkpointing = !config.checkpointDir.empty();
  dispatch.pauseBetweenEpochs = checkpointing;
  // A worker lost for missed heartbeats still holds its connections to the servers: the
  // dispatcher's monitor thread tells them over connections of its own.
  dispatch.heartbeat = heartbeatOf(config);
  std::optional<ps::ServerGroup> drops;
  if (dispatch.heartbeat.count() > 0) {
    drops.emplace(
        ps::ClientOptions{ps::ClientRole::Chief, 0, ps::Compression::None, plan.role.token,
                          plan.timeout, false},  // sends drops only: no values to share
        plan.placement, serverAddresses(store, plan));
    dispatch.onLost = [&drops](int worker) { drops->drop(worker); };
  }
  ps::UnitDispatcher dispatcher(dispatch);
  store.setString(ps::shapeKey(),
                  std::to_string(plan.role.servers) + " " + std::to_string(plan.role.workers));
  store.setString(ps::chiefAddressKey(),
                  comm::HostPort{dispatch.host, dispatcher.port()}.toString());
  ps::ServerGroup servers({ps::ClientRole::Chief, 0, ps::Compression::None, plan.role.token,
                           plan.timeout, config.psTransport != "tcp"},
                          plan.placement, serverAddresses(store, plan));
  const data::FashionMnist test(config.dataDir, false);
  std::unique_ptr<observe::MetricsWriter> metrics;
  if (!config.metricsPath.empty())  // a resumed run continues the file
    metrics = std::make_unique<observe::MetricsWriter>(config.metricsPath, firstEpoch > 0);
  if (plan.resume && !config.quiet)
    logger.info("resuming", {{"checkpoint", plan.resume->path}, {"epoch", firstEpoch}});
  if (!config.quiet) {
    logger.info("training", {{"model", config.model},
                             {"strategy", "parameter-server"},
                             {"ps_mode", ps::modeName(plan.mode)},
                             {"servers", plan.role.servers},
                             {"workers", plan.role.workers},
                             {"optimizer", plan.recipe.optimizer},
                             {"lr", plan.recipe.lr},
                             {"ps_overlap", config.psOverlap},
                             {"batch_per_worker", config.batch},
                             {"epochs", plan.recipe.epochs}});
  }
  std::shared_ptr<optim::LrSchedule> schedule = makeSchedule(plan.recipe, plan.totalUpdates);
  double trainLoss = 0.0, accuracy = 0.0, seconds = 0.0, previous = 0.0;
  int64_t samples = 0;
  // The epochs after this run's first, when every worker has loaded its data and started: the
  // steady rate, as the peers measure theirs (PyTorch's RPC example from each worker's 11th
  // step on).
  double steadySamples = 0.0, steadySeconds = 0.0;
  auto lostFields = [&dispatcher] {
    observe::Value::Array list;
    for (const ps::LostWorker& lost : dispatcher.lost())
      list.push_back(observe::Fields{{"worker", lost.index},
                                     {"at_s", lost.atSeconds},
                                     {"unit", lost.unit},
                                     {"cause", lost.heartbeat ? "heartbeat" : "connection"}});
    return list;
  };
  for (int64_t epoch = firstEpoch; epoch < plan.recipe.epochs; ++epoch) {
    const ps::EpochReport done = dispatcher.waitEpoch(epoch);
    if (checkpointing) {
      const bool last = epoch + 1 == plan.recipe.epochs;
      if (last || (config.checkpointEvery > 0 && (epoch + 1) % config.checkpointEvery == 0))
        writeCheckpoint(config, plan, servers, epoch + 1, logger);
      dispatcher.releaseEpoch(epoch + 1);
    }
    const int64_t updates = servers.pull(plan.parameters);
    accuracy = train::evaluate(*plan.model, test).accuracy;
    trainLoss = done.batches > 0 ? done.lossSum / done.batches : 0.0;
    const double epochSamples = static_cast<double>(done.batches * config.batch);
    samples += done.batches * config.batch;
    const double rate = epochSamples / std::max(done.seconds - previous, 1e-9);
    if (epoch > firstEpoch) {
      steadySamples += epochSamples;
      steadySeconds += done.seconds - previous;
    }
    previous = done.seconds;
    seconds = done.seconds;
    if (!config.quiet) {
      std::fprintf(stderr, "epoch %lld/%lld  loss %.4f  test accuracy %.4f  %.0f samples/s\n",
                   static_cast<long long>(epoch + 1), static_cast<long long>(plan.recipe.epochs),
                   trainLoss, accuracy, rate);
    }
    if (metrics) {
      observe::Fields line = {
          {"epoch", epoch + 1},
          {"step", updates},
          {"train_loss", trainLoss},
          {"test_accuracy", accuracy},
          {"samples_per_s", rate},
          {"wall_s", std::chrono::duration<double>(Clock::now() - start).count()},
          {"lr", schedule->lrAt(std::min(updates, plan.totalUpdates - 1))},
          {"ps_mode", ps::modeName(plan.mode)}};
      line.update(serverFields(servers.stats(), seconds));
      line.set("workers_alive", dispatcher.workersAlive());
      line.set("workers_lost", lostFields());
      metrics->write(line);
    }
  }
  dispatcher.waitWorkersFinished();
  // Before the servers stop: a worker that has not connected yet learns the job is over.
  store.setString(ps::finishedKey(), "1");
  const int64_t updates = servers.pull(plan.parameters);
  const std::vector<ps::ServerStats> stats = servers.stats();
  servers.shutdown();
  if (!config.savePath.empty()) {
    checkpoint::saveSafetensors(
        config.savePath, plan.model->stateDict(),
        {{"format", "pt"}, {"model", config.model}, {"step", std::to_string(updates)}});
  }
  const double samplesPerSecond = samples / std::max(seconds, 1e-9);
  const double steadyPerSecond =
      steadySeconds > 0.0 ? steadySamples / steadySeconds : samplesPerSecond;
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const observe::Fields server = serverFields(stats, seconds);
  const std::vector<int64_t> unitsDone = dispatcher.unitsDone();
  if (metrics) {
    observe::Fields line = {{"epoch", plan.recipe.epochs},       {"step", updates},
                            {"train_loss", trainLoss},           {"test_accuracy", accuracy},
                            {"samples_per_s", samplesPerSecond},
                            {"steady_samples_per_s", steadyPerSecond},
                            {"wall_s", wall},                    {"ps_mode", ps::modeName(plan.mode)}};
    line.update(server);
    line.set("workers_alive", dispatcher.workersAlive());
    line.set("workers_lost", lostFields());
    line.set("units_done", observe::Value::Array(unitsDone.begin(), unitsDone.end()));
    line.set("final", true);
    metrics->write(line);
  }
  for (const ps::LostWorker& lost : dispatcher.lost()) {
    logger.warn("lost a worker; its unit went to the others",
                {{"worker", lost.index}, {"at_s", lost.atSeconds}, {"unit", lost.unit}});
  }
  if (!config.quiet) {
    std::fprintf(stderr,
                 "trained %s with %d parameter server(s) and %d worker(s) (%s): %lld "
                 "updates, test accuracy %.2f%%\n",
                 config.model.c_str(), plan.role.servers, plan.role.workers,
                 ps::modeName(plan.mode), static_cast<long long>(updates), 100.0 * accuracy);
  }
  std::printf("test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f "
              "steady_samples_per_s %.1f wall_s %.1f ps_mode %s staleness_max %lld "
              "workers_alive %d\n",
              accuracy, trainLoss, static_cast<long long>(updates), samplesPerSecond,
              steadyPerSecond, wall,
              ps::modeName(plan.mode), static_cast<long long>(stalenessMax(stats)),
              dispatcher.workersAlive());
  std::fflush(stdout);
  return 0;
}

/// A store for a job that was started without one (mpirun, srun): rank 0 (server 0) hosts it
/// with a fresh token and tells every rank where it is through one broadcast over the job's
/// communicator. Returns the hosted server on rank 0 (it must outlive the job's start).
std::unique_ptr<comm::TcpStoreServer> bootstrapStore(PsPlan& plan) {
  const std::shared_ptr<comm::Communicator> communicator =
      comm::initFromEnvironment({.timeout = plan.timeout});
  std::unique_ptr<comm::TcpStoreServer> hosted;
  // Whether every rank runs on rank 0's host, from the host names themselves: the launchers'
  // local sizes cannot tell (a PyTorchJob's pods set RANK and WORLD_SIZE but no
  // LOCAL_WORLD_SIZE, which reads as one host). Only then may the store listen on loopback.
  char host[256] = {}, rootHost[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::memcpy(rootHost, host, sizeof host);
  communicator->broadcast(rootHost, sizeof rootHost, DType::U8, 0);
  const int32_t away = std::strcmp(host, rootHost) != 0 ? 1 : 0;
  int32_t ranksAway = 0;
  communicator->allreduce(&away, &ranksAway, 1, DType::I32, comm::ReduceOp::Sum);
  plan.role.local = ranksAway == 0;
  char text[512] = {};
  if (communicator->rank() == 0) {
    const std::string token = comm::detail::randomToken(16);  // 128 bits as 32 hex digits
    hosted = std::make_unique<comm::TcpStoreServer>(
        comm::TcpStoreServerOptions{.host = plan.role.local ? "127.0.0.1" : "", .token = token});
    // Elsewhere the others reach this host by its name (a pod's, which its service resolves).
    const std::string published = plan.role.local ? "127.0.0.1" : host;
    std::snprintf(text, sizeof text, "%s %s",
                  comm::HostPort{published, hosted->port()}.toString().c_str(), token.c_str());
  }
  communicator->broadcast(text, sizeof text, DType::U8, 0);
  const std::string reply(text);
  const size_t space = reply.find(' ');
  KOLO_CHECK(space != std::string::npos, "store address from rank 0: '", reply, "'");
  plan.role.store = reply.substr(0, space);
  plan.role.token = reply.substr(space + 1);
  return hosted;
}

}  // namespace

int runParameterServerRole(const TrainConfig& given, observe::Logger& logger) {
  TrainConfig config = given;
  // A worker's batch is one push: by default 64, the batch of PyTorch's parameter-server
  // examples. Async with three workers reached 0.869-0.874 test accuracy in three epochs at 64
  // and 0.859-0.868 at one device's 128 (docs/parameter_server.md); sync with two workers at
  // 64 each is one device's global batch of 128.
  if (!config.batchGiven) config.batch = kDefaultWorkerBatch;
  KOLO_REQUIRE(config.threads >= 1, "--threads must be at least 1, got ", config.threads);
  openblas_set_num_threads(config.threads);
  // Only workers read training samples; the servers and the chief need their number, which
  // the labels file tells without the 47 MB of images.
  const bool worker = ps::roleFromEnvironment().role == ps::Role::Worker;
  const std::shared_ptr<data::TensorDataset> train = worker ? loadTrainingSet(config) : nullptr;
  const int64_t trainSize =
      train ? train->size()
            : data::readIdx(config.dataDir + "/train-labels-idx1-ubyte.gz", config.trainLimit)
                  .dims.at(0);
  PsPlan plan = makePlan(config, trainSize);
  const std::unique_ptr<comm::TcpStoreServer> hostedStore =
      plan.role.store.empty() ? bootstrapStore(plan) : nullptr;
  const std::shared_ptr<comm::Store> store =
      comm::connectTcpStore(plan.role.store, plan.role.token, plan.timeout);
  switch (plan.role.role) {
    case ps::Role::Server:
      return runServer(config, plan, *store);
    case ps::Role::Worker:
      return runWorker(config, plan, *store, *train, logger);
    case ps::Role::Chief:
      return runChief(config, plan, *store, logger);
  }
  return 1;
}

}  // namespace kolo::cli
