// `kolo train` under the data-parallel strategies: the flags mapped onto a
// train::DataParallelEngine over the built-in model and onto train::fit's options; the
// faults of the test and benchmark flags become fit's callbacks (train::injectFaults). The
// loop is the library's.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "cli/train_loop.h"
#include "kolo/comm/init.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/compression.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/safetensors.h"
#include "kolo/threads.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"

namespace kolo::cli {
namespace {

using parallel::StrategyKind;

// Whether this node has a core beyond those the compute threads of its ranks occupy.
bool hasSpareCore(int localThreads) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int localRanks = std::max(1, comm::detectLaunch().localSize);
  return cores > static_cast<unsigned>(localRanks * localThreads);
}

// "on", "off", or for "auto" whether there is a spare core: overlapping bucket all-reduces
// with backward needs one for communication progress, and a prefetch thread without one
// only takes turns with the compute thread, so every step waits for it to be scheduled.
bool onOrSpareCore(const std::string& choice, int localThreads) {
  if (choice == "on") return true;
  if (choice == "off") return false;
  return hasSpareCore(localThreads);
}


}  // namespace

void checkDataParallelFlags(const TrainConfig& config) {
  KOLO_REQUIRE(config.threads >= 1, "--threads must be at least 1, got ", config.threads);
  KOLO_REQUIRE(config.replicas >= 1, "--replicas must be at least 1, got ", config.replicas);
  KOLO_REQUIRE(config.bucketMb > 0 && config.firstBucketMb > 0,
               "--bucket-mb and --first-bucket-mb must be above 0, got ", config.bucketMb, " and ",
               config.firstBucketMb);
  for (const auto& [flag, value] : {std::pair{"--overlap", &config.overlap},
                                     std::pair{"--shard-optimizer", &config.shardOptimizer},
                                     std::pair{"--prefetch", &config.prefetch}}) {
    KOLO_REQUIRE(*value == "auto" || *value == "on" || *value == "off", flag, " '", *value,
                 "' is not accepted: use auto, on or off");
  }
  KOLO_REQUIRE(config.trainLimit >= 0, "--train-limit must be at least 0, got ", config.trainLimit);
  // A communication hook replaces the all-reduce that the sharded update reads around.
  KOLO_REQUIRE(parallel::compression::parseCompressSpec(config.compress).method == "none" ||
                   config.shardOptimizer != "on",
               "--compress ", config.compress, " cannot be combined with --shard-optimizer on");
}

train::DataParallelOptions engineOptions(const TrainConfig& config,
                                         std::shared_ptr<comm::Communicator> comm) {
  const StrategyKind kind = parallel::parseStrategyKind(config.strategy);
  const bool inProcessReplicas =
      kind == StrategyKind::Mirrored || kind == StrategyKind::CentralStorage;
  const int localThreads = (inProcessReplicas ? config.replicas : 1) * config.threads;
  train::DataParallelOptions options;
  options.strategy = parallel::strategyOptionsFromNames(config.strategy, config.replicas,
                                                        config.reduction, config.algorithm, comm);
  parallel::ReducerOptions& reducer = options.strategy.reducer;
  reducer.bucketCapBytes = static_cast<size_t>(config.bucketMb * (1 << 20));
  reducer.firstBucketCapBytes = static_cast<size_t>(config.firstBucketMb * (1 << 20));
  reducer.overlap = onOrSpareCore(config.overlap, localThreads);
  reducer.shardOptimizer =
      config.shardOptimizer == "on" ||
      (config.shardOptimizer == "auto" && config.algorithm == "auto" && !reducer.overlap);
  options.strategy.shard = parallel::parseShardLevel(config.shard);
  options.recompute = config.recompute;
  if (kind == StrategyKind::FullyShardedDataParallel) {
    options.strategy.shardGroup = shardGroupSize(config, comm->size());
    options.strategy.unitMinParameters = config.unitParams;
  }
  options.clipNorm = config.clipNorm;
  options.commHook = parallel::compression::makeCommHook(
      parallel::compression::parseCompressSpec(config.compress));
  if (options.commHook) reducer.shardOptimizer = false;
  if (config.balance) {
    options.balanceBatch = config.batch;
    options.balancer.replanEvery = config.balanceEvery;
  }
  return options;
}

int runDataParallel(const TrainConfig& config, observe::Logger& logger) {
  const StrategyKind kind = parallel::parseStrategyKind(config.strategy);
  checkDataParallelFlags(config);
  setNumThreads(config.threads);
  // Validate the flags before the (slow) data loading and before joining the job.
  Recipe recipe = resolveRecipe(config, 1);
  std::shared_ptr<data::TensorDataset> train = loadTrainingSet(config);
  auto test = std::make_shared<data::FashionMnist>(config.dataDir, false);
  std::shared_ptr<comm::Communicator> comm;
  if (kind == StrategyKind::MultiWorkerMirrored || kind == StrategyKind::FullyShardedDataParallel)
    comm = parallel::init();
  const int64_t stepsPerEpoch = train::stepsPerEpoch(train->size(), config.batch, config.dropLast);
  recipe = resolveRecipe(config, stepsPerEpoch);

  // Every replica starts from the same seeded init (or --init file); the strategy also
  // copies replica 0's (rank 0's) weights to the others.
  auto models = [&config]() -> std::shared_ptr<nn::Module> {
    Generator generator(config.seed);
    std::shared_ptr<nn::Module> model = nn::makeModel(config.model, generator);
    if (!config.initPath.empty()) loadInitialWeights(config.initPath, *model);
    return model;
  };
  auto optimizers = [&recipe](const parallel::NamedTensors& parameters) {
    return makeOptimizer(recipe, parameters);
  };
  train::DataParallelEngine engine(models, optimizers, engineOptions(config, comm));
  if (!config.initPath.empty() && engine.isPrimary())
    logger.info("loaded initial weights", {{"file", config.initPath}});
  const int rank = engine.rank();

  train::FitOptions options = fitOptions(config, recipe, logger);
  const bool inProcessReplicas =
      kind == StrategyKind::Mirrored || kind == StrategyKind::CentralStorage;
  options.prefetch =
      onOrSpareCore(config.prefetch, (inProcessReplicas ? config.replicas : 1) * config.threads) ? 2 : 0;
  options.checkSyncEvery = config.checkSync;
  // --detect-anomaly, and --debug-nan-at whose NaN it must name, watch the modules that run
  // forward: central storage's model never does.
  if (config.detectAnomaly || config.faults.nan.step >= 0) {
    KOLO_REQUIRE(kind != StrategyKind::CentralStorage,
                 "--detect-anomaly watches the modules that run forward: use it with one-device, "
                 "mirrored (replica 0) or multi-worker-mirrored, not central-storage");
    // Parameter gradients are read as they become final, not while a reducer all-reduces
    // buckets in place during backward.
    options.anomalyDetector = std::make_shared<observe::AnomalyDetector>(
        engine.model(), observe::AnomalyOptions{.parameterGradients = kind == StrategyKind::OneDevice, .rank = rank});
  }
  const train::FitCallbacks callbacks =
      train::injectFaults(config.faults, rank, {}, &engine.model(), options.anomalyDetector.get());

  const train::FitSummary summary = train::fit(engine, train, test, options, callbacks);
  if (!config.savePath.empty()) {
    engine.gatherModel();  // collective under fsdp
    if (engine.isPrimary()) {
      checkpoint::saveSafetensors(
          config.savePath, engine.model().stateDict(),
          {{"format", "pt"}, {"model", config.model}, {"step", std::to_string(summary.steps)}});
      logger.info("saved weights", {{"file", config.savePath}});
    }
  }
  if (!engine.isPrimary()) return 0;
  if (!config.quiet) {
    std::fprintf(stderr, "trained %s for %lld steps on %d replica(s): test accuracy %.2f%%\n",
                 config.model.c_str(), static_cast<long long>(summary.steps), engine.replicas(),
                 100.0 * summary.validationAccuracy);
  }
  std::printf(
      "test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f steady_samples_per_s "
      "%.1f wall_s %.1f grad_bytes_per_step %.0f\n",
      summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
      summary.samplesPerSecond, summary.steadySamplesPerSecond, summary.wallSeconds,
      summary.gradBytesPerStep);
  std::fflush(stdout);
  return 0;
}

}  // namespace kolo::cli
