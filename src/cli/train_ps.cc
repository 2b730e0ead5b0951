// `kolo train --strategy parameter-server`: the flags mapped onto train::trainParameterServer,
// which runs this process's role of the job started by kolo run --ps P --workers W. Here: the
// flags' defaults for the modes (Adam in async and ssp, a worker's batch of 64), the data
// (training images on workers only), the test hooks as callbacks, and the chief's summary.
#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/train_loop.h"
#include "kolo/parallel/parameter_server.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/parameter_server.h"

namespace kolo::cli {
namespace {

namespace ps = parallel::ps;

// A worker's batch is one push: by default 64, the batch of PyTorch's parameter-server
// examples. Async with three workers reached 0.869-0.874 test accuracy in three epochs at 64
// and 0.859-0.868 at one device's 128 (docs/parameter_server.md); sync with two workers at
// 64 each is one device's global batch of 128.
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
  if (!config.givenFlags.count("--batch")) config.batch = kDefaultWorkerBatch;
  if (!adamDefaults(config, mode)) return config;
  config.optimizer = "adam";
  config.lr = 1e-3;
  if (config.schedule == "auto") config.schedule = "cosine";
  return config;
}

std::optional<bool> onOffAuto(const std::string& value) {
  if (value == "auto") return std::nullopt;
  return value == "on";
}

/// The library's options from the flags (`given` before the mode's defaults).
train::ParameterServerOptions psOptions(const TrainConfig& given, const TrainConfig& config,
                                        const Recipe& recipe, observe::Logger& logger) {
  const ps::Mode mode = ps::parseMode(config.psMode);
  train::ParameterServerOptions options;
  options.mode = mode;
  options.staleness = config.staleness;
  options.shardBytes = config.psShardBytes;
  options.unitBatches = config.psUnitBatches;
  options.compression = ps::parseCompression(config.psCompress);
  options.sharedMemory = config.psTransport != "tcp";
  options.heartbeat =
      std::chrono::milliseconds(static_cast<int64_t>(config.psHeartbeatSeconds * 1000));
  options.stalenessLr = onOffAuto(config.psStalenessLr);
  options.overlap = onOffAuto(config.psOverlap);
  // A look-ahead asked for overlaps the exchange; Adam's defaults look ahead 1.5 where it is
  // overlapped anyway.
  const bool lookaheadAsked = config.psLookahead.value_or(0.0) != 0.0;
  if (lookaheadAsked && config.psOverlap == "auto") options.overlap = true;
  options.lookahead = config.psLookahead.value_or(
      adamDefaults(given, mode) && config.psOverlap != "off" ? 1.5 : 0.0);
  if (const auto seconds = settings::timeout())
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  setRunOptions(config, recipe, logger, options);
  options.describe.set("ps_overlap", config.psOverlap);
  options.schedule = [config](int64_t totalSteps, int64_t stepsPerEpoch) {
    return optim::makeSchedule(resolveRecipe(config, stepsPerEpoch).schedule, totalSteps);
  };
  options.identity["ps-unit-batches"] = std::to_string(config.psUnitBatches);
  options.identity["train-limit"] = std::to_string(config.trainLimit);
  return options;
}

/// The faults before each push (counted from 0): --debug-slow-worker's worker (a worker index)
/// takes FACTOR times as long, sleeping the difference; --debug-kill-rank's and
/// --fail-at-step's launch ranks strike.
train::ParameterServerCallbacks testHooks(const TrainConfig& config) {
  train::ParameterServerCallbacks callbacks;
  const int rank = static_cast<int>(settings::rank().value_or(-1));
  callbacks.beforePush = [faults = config.faults, rank](const train::WorkerPush& push) {
    if (push.worker == faults.slow.rank)
      std::this_thread::sleep_for(std::chrono::duration<double>(push.seconds * (faults.slow.factor - 1.0)));
    faults.strike(rank, push.push, "push");
  };
  return callbacks;
}

void printChiefSummary(const TrainConfig& config, const train::ParameterServerSummary& summary,
                       const ps::RoleInfo& role) {
  if (!config.quiet) {
    std::fprintf(stderr,
                 "trained %s with %d parameter server(s) and %d worker(s) (%s): %lld "
                 "updates, test accuracy %.2f%%\n",
                 config.model.c_str(), role.servers, role.workers, config.psMode.c_str(),
                 static_cast<long long>(summary.steps), 100.0 * summary.validationAccuracy);
  }
  std::printf("test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f "
              "steady_samples_per_s %.1f wall_s %.1f ps_mode %s staleness_max %lld "
              "workers_alive %d\n",
              summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
              summary.samplesPerSecond, summary.steadySamplesPerSecond, summary.wallSeconds,
              config.psMode.c_str(), static_cast<long long>(summary.stalenessMax),
              summary.workersAlive);
  std::fflush(stdout);
}

}  // namespace

int runParameterServerRole(const TrainConfig& given, observe::Logger& logger) {
  const TrainConfig config = withModeDefaults(given, ps::parseMode(given.psMode));
  KOLO_REQUIRE(config.model != "lm", "--strategy parameter-server trains --model mlp or cnn, not lm");
  setNumThreads(config.threads);
  const Recipe recipe = resolveRecipe(config, 1);
  // Every process builds the same seeded model (or the --init file's weights); on the chief
  // the last one built holds the trained weights at the end.
  std::shared_ptr<nn::Module> built;
  auto model = [&config, &built]() -> std::shared_ptr<nn::Module> { return built = buildModel(config); };
  auto optimizer = [recipe](const parallel::NamedTensors& slices) {
    return optim::makeOptimizer(recipe.optimizer, slices);
  };
  // Only workers read training images; the others need their number, which the labels file
  // tells without the 47 MB of images.
  train::ParameterServerData data;
  data.train = [&config] { return loadTrainingSet(config); };
  const ps::RoleInfo role = ps::roleFromEnvironment();
  if (role.role != ps::Role::Worker)
    data.trainSize =
        data::readIdx(config.dataDir + "/train-labels-idx1-ubyte.gz", config.trainLimit).dims.at(0);
  data.validation = [&config] { return std::make_shared<data::FashionMnist>(config.dataDir, false); };
  const train::ParameterServerSummary summary = train::trainParameterServer(
      model, optimizer, data, psOptions(given, config, recipe, logger), testHooks(config));
  if (summary.role != ps::Role::Chief) return 0;
  saveWeights(config, *built, summary.steps, logger);
  printChiefSummary(config, summary, role);
  return 0;
}

}  // namespace kolo::cli
