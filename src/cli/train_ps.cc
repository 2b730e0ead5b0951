// `kolo train --strategy parameter-server`: the flags mapped onto train::trainParameterServer,
// which runs this process's role of the job started by kolo run --ps P --workers W. Here: the
// flags' defaults for the modes (Adam in async and ssp, 64 samples a push), the data
// (training images on workers only), and the chief's summary.
#include <chrono>
#include <cstdio>

#include "cli/train_loop.h"
#include "kolo/data_files.h"
#include "kolo/parallel/parameter_server.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/parameter_server.h"

namespace kolo::cli {
namespace {

namespace ps = parallel::ps;

// --batch is the global batch, a step's samples, as under every strategy. Without it a push
// is 64 samples, the batch of PyTorch's parameter-server examples: async's step is one push
// (with three workers it reached 0.869-0.874 test accuracy in three epochs at 64 and
// 0.859-0.868 at one device's 128, docs/parameter_server.md); sync's is one push of each
// worker, 64 x W (two workers: one device's 128).
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

/// The flags' defaults for the mode: the batch, and adamDefaults' recipe and look-ahead.
TrainConfig withModeDefaults(TrainConfig config, int workers) {
  train::ParameterServerOptions& options = config.ps;
  if (!config.givenFlags.count("--batch"))
    config.batch = kDefaultWorkerBatch * (options.mode == ps::Mode::Sync ? workers : 1);
  const bool adam = adamDefaults(config, options.mode);
  // A look-ahead asked for overlaps the exchange; Adam's defaults look ahead 1.5 where it is
  // overlapped anyway.
  if (!config.givenFlags.count("--ps-lookahead") && adam && options.overlap.value_or(true))
    options.lookahead = 1.5;
  else if (options.lookahead != 0.0 && !options.overlap)
    options.overlap = true;
  if (!adam) return config;
  config.optimizer = "adam";
  config.lr = 1e-3;
  if (config.schedule == "auto") config.schedule = "cosine";
  return config;
}

/// The library's options from the flags (`given` before the mode's defaults).
train::ParameterServerOptions psOptions(const TrainConfig& given, const TrainConfig& config,
                                        const Recipe& recipe, observe::Logger& logger) {
  train::ParameterServerOptions options = config.ps;
  if (const auto seconds = settings::timeout())
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  setRunOptions(config, recipe, logger, options);
  options.describe.set("ps_overlap", !given.ps.overlap ? "auto" : *given.ps.overlap ? "on" : "off");
  options.schedule = [config](int64_t totalSteps, int64_t stepsPerEpoch) {
    return optim::makeSchedule(resolveRecipe(config, stepsPerEpoch).schedule, totalSteps);
  };
  options.identity["ps-unit-batches"] = std::to_string(options.unitBatches);
  options.identity["train-limit"] = std::to_string(config.data.trainLimit);
  return options;
}

void printChiefSummary(const TrainConfig& config, const train::ParameterServerSummary& summary,
                       const ps::RoleInfo& role) {
  if (!config.quiet) {
    std::fprintf(stderr,
                 "trained %s with %d parameter server(s) and %d worker(s) (%s): %lld "
                 "updates, test accuracy %.2f%%\n",
                 config.model.c_str(), role.servers, role.workers, ps::modeName(config.ps.mode),
                 static_cast<long long>(summary.steps), 100.0 * summary.validationAccuracy);
  }
  std::printf("test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f "
              "steady_samples_per_s %.1f wall_s %.1f ps_mode %s staleness_max %lld "
              "workers_alive %d\n",
              summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
              summary.samplesPerSecond, summary.steadySamplesPerSecond, summary.wallSeconds,
              ps::modeName(config.ps.mode), static_cast<long long>(summary.stalenessMax),
              summary.workersAlive);
  std::fflush(stdout);
}

}  // namespace

int runParameterServerRole(const TrainConfig& given, observe::Logger& logger) {
  const ps::RoleInfo role = ps::roleFromEnvironment();
  TrainConfig config = withModeDefaults(given, role.workers);
  KOLO_REQUIRE(config.model != "lm", "--strategy parameter-server trains --model mlp or cnn, not lm");
  setNumThreads(config.threads);
  const Recipe recipe = resolveRecipe(config, 1);
  // Every process builds the same seeded model (or the --init file's weights); the chief's
  // summary carries the one holding the trained weights.
  auto model = [&config]() -> std::shared_ptr<nn::Module> { return buildModel(config); };
  auto optimizer = [recipe](const parallel::NamedTensors& slices) {
    return optim::makeOptimizer(recipe.optimizer, slices);
  };
  // Fashion-MNIST: only workers read training images; the others need their number, which the
  // labels file tells without the 47 MB of images. Other data (a table, arrays, images) is read
  // by every role first: the model's sizes follow it.
  train::ParameterServerData data;
  if (data::dataPathKind(config.data.path) == data::DataPathKind::FashionMnist) {
    data.train = [&config] { return std::make_shared<data::FashionMnist>(config.data.path, true, config.data.trainLimit); };
    if (role.role != ps::Role::Worker)
      data.trainSize =
          data::readIdx(config.data.path + "/train-labels-idx1-ubyte.gz", config.data.trainLimit).dims.at(0);
    data.validation = [&config] { return std::make_shared<data::FashionMnist>(config.data.path, false); };
  } else {
    const data::TrainingData sets = loadDatasets(config, logger);
    data.train = [sets] { return sets.train; };
    data.validation = [sets] { return sets.validation; };
  }
  const train::ParameterServerSummary summary = train::trainParameterServer(
      model, optimizer, data, psOptions(given, config, recipe, logger),
      train::injectWorkerFaults(config.faults, static_cast<int>(settings::rank().value_or(-1))));
  if (summary.role != ps::Role::Chief) return 0;
  saveWeights(config, *summary.model, summary.steps, logger);
  printChiefSummary(config, summary, role);
  return 0;
}

}  // namespace kolo::cli
