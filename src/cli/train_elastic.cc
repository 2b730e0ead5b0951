// `kolo train --strategy multi-worker-mirrored` under `kolo run --elastic`: the flags mapped
// onto a train::ElasticEngine over this rank's parallel::ElasticContext and onto train::fit's
// options; the loop, the membership changes and the save before stopping are the library's.
// The test and benchmark flags (--debug-kill-rank, --debug-kill-in-regroup,
// --debug-await-join, --debug-sample-log, --debug-slow-rank) become the context's hook and
// fit's callbacks.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "cli/train_loop.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/nn/models.h"
#include "kolo/safetensors.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/elastic.h"
#include "kolo/train/faults.h"

namespace kolo::cli {
namespace {

// Where a --debug-kill-rank rank writes the moment of its kill (for since_kill_s).
constexpr const char* kKillMomentKey = "kolo-elastic/debug-kill-ns";

int64_t wallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<comm::Store> connectJobStore() {
  return comm::connectTcpStore(settings::store(), settings::token(), std::chrono::seconds(10));
}

// --debug-kill-rank R:STEP under --elastic: launch rank R records the moment, then raises
// the signal before STEP.
void killAndRecordIfAsked(const train::FaultPlan::Kill& kill, int id, int64_t step) {
  if (step != kill.step || std::find(kill.ranks.begin(), kill.ranks.end(), id) == kill.ranks.end()) return;
  std::fflush(nullptr);
  connectJobStore()->setString(kKillMomentKey, std::to_string(wallNanos()));
  ::raise(kill.signal);
}

// The engine's options from the flags: multi-worker-mirrored's reducer settings,
// --recompute and --balance; the recovered event gains since_kill_s where a --debug-kill-rank rank recorded
// its moment. `comm`: generation 0's communicator (the engine uses each generation's).
train::ElasticEngineOptions engineOptions(const TrainConfig& config, observe::Logger& logger,
                                          std::shared_ptr<comm::Communicator> comm) {
  train::ElasticEngineOptions options;
  options.dataParallel.strategy = parallel::strategyOptionsFromNames(
      config.strategy, 1, config.reduction, config.algorithm, std::move(comm));
  parallel::ReducerOptions& reducer = options.dataParallel.strategy.reducer;
  reducer.bucketCapBytes = static_cast<size_t>(config.bucketMb * (1 << 20));
  reducer.firstBucketCapBytes = static_cast<size_t>(config.firstBucketMb * (1 << 20));
  options.dataParallel.recompute = config.recompute;
  if (config.balance) {
    options.dataParallel.balanceBatch = config.batch;
    options.dataParallel.balancer.replanEvery = config.balanceEvery;
  }
  options.logger = &logger;
  if (!config.faults.kill.ranks.empty())
    options.onRecovered = [](observe::Fields& fields) {
      std::shared_ptr<comm::Store> store = connectJobStore();
      if (!store->check({kKillMomentKey})) return;
      const int64_t killed = std::stoll(store->getString(kKillMomentKey, std::chrono::seconds(1)));
      fields.set("since_kill_s", static_cast<double>(wallNanos() - killed) / 1e9);
    };
  return options;
}

// --debug-sample-log FILE: FILE.rank-ID gets a `pid` line, then `GENERATION STEP ID...` for
// each step this rank completes (the samples it trained on).
class SampleLog {
 public:
  SampleLog(const std::string& prefix, int id) {
    if (prefix.empty()) return;
    const std::string path = prefix + ".rank-" + std::to_string(id);
    out_.open(path, std::ios::trunc);
    KOLO_REQUIRE(out_.good(), "--debug-sample-log: cannot write ", path);
    out_ << "pid " << ::getpid() << '\n' << std::flush;  // one process throughout
  }
  void write(train::ElasticEngine& engine, const train::StepEnd& end) {
    if (!out_.is_open()) return;
    // Balanced: the whole global batch was loaded; this rank trained on its share.
    const std::vector<int64_t>& loaded = end.batch->indices;
    const parallel::Balancer* balancer = engine.balancer();
    const auto first = loaded.begin() + (balancer ? balancer->offset() : 0);
    const auto last = balancer ? first + balancer->share() : loaded.end();
    out_ << engine.context().generation() << ' ' << end.step;
    for (auto index = first; index != last; ++index) out_ << ' ' << *index;
    out_ << '\n' << std::flush;
  }

 private:
  std::ofstream out_;
};

}  // namespace

int runElasticTraining(const TrainConfig& config, observe::Logger& logger) {
  KOLO_REQUIRE(config.strategy == "multi-worker-mirrored",
               "kolo run --elastic trains with --strategy multi-worker-mirrored, not --strategy ",
               config.strategy);
  KOLO_REQUIRE(config.initPath.empty() && config.clipNorm == 0.0 && !config.detectAnomaly &&
                   config.checkSync == 0,
               "--init, --clip-norm, --detect-anomaly and --check-sync are not available under kolo "
               "run --elastic");
  KOLO_REQUIRE(config.threads >= 1, "--threads must be at least 1, got ", config.threads);
  setNumThreads(config.threads);
  Recipe recipe = resolveRecipe(config, 1);
  std::shared_ptr<data::TensorDataset> train = loadTrainingSet(config);
  auto test = std::make_shared<data::FashionMnist>(config.dataDir, false);
  recipe = resolveRecipe(config, train::stepsPerEpoch(train->size(), config.batch, config.dropLast));

  parallel::ElasticOptions elasticOptions;
  if (config.debugKillInRegroup >= 0)
    elasticOptions.onAgreed = [&config](int64_t) {
      if (settings::rank() == config.debugKillInRegroup) {
        std::fflush(nullptr);
        ::raise(SIGKILL);
      }
    };
  // A rank started in a lost one's place returns once a generation admitted it, or null
  // when the job finished first.
  std::shared_ptr<parallel::ElasticContext> context =
      parallel::ElasticContext::fromEnvironment(std::move(elasticOptions));
  if (!context) {
    logger.info("elastic: the job finished before this rank was admitted", {{"rank", *settings::rank()}});
    return 0;
  }
  const int id = context->id();
  auto models = [&config]() -> std::shared_ptr<nn::Module> {
    Generator generator(config.seed);
    return nn::makeModel(config.model, generator);
  };
  auto optimizers = [&recipe](const parallel::NamedTensors& parameters) { return makeOptimizer(recipe, parameters); };
  train::ElasticEngine engine(context, models, optimizers, engineOptions(config, logger, context->communicator()));

  train::FitOptions options = fitOptions(config, recipe, logger);
  options.prefetch = 0;
  options.describe.set("min_ranks", context->minRanks());
  // The test and benchmark hooks, before each step in the order the members agree on it:
  // a failure and a slow rank's sleep (train::injectFaults), a kill that records its moment,
  // the wait for a joiner; after it the sample log.
  SampleLog sampleLog(config.debugSampleLog, id);
  train::FitCallbacks hooks;
  hooks.onStepBegin = [&](int64_t step) {
    killAndRecordIfAsked(config.faults.kill, id, step);
    if (step == config.debugAwaitJoin && context->size() < context->maxRanks())
      context->awaitJoiners(std::chrono::minutes(5));
  };
  hooks.onStepEnd = [&](const train::StepEnd& end) { sampleLog.write(engine, end); };
  train::FaultPlan faults = config.faults;
  faults.kill = {};  // killAndRecordIfAsked's
  const train::FitCallbacks callbacks = train::injectFaults(faults, id, hooks);

  const train::FitSummary summary = train::fit(engine, train, test, options, callbacks);
  if (!engine.isPrimary()) return 0;
  if (!config.savePath.empty()) {
    checkpoint::saveSafetensors(config.savePath, engine.model().stateDict(),
                                {{"format", "pt"}, {"model", config.model}, {"step", std::to_string(summary.steps)}});
    logger.info("saved weights", {{"file", config.savePath}});
  }
  std::printf("test_accuracy %.4f train_loss %.4f steps %lld world_size %d generation %lld wall_s %.1f\n",
              summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
              context->size(), static_cast<long long>(context->generation()), summary.wallSeconds);
  std::fflush(stdout);
  return 0;
}

}  // namespace kolo::cli
