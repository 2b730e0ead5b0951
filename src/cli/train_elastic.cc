// `kolo train` under `kolo run --elastic` (train_run.cc trains it): the flags mapped onto a
// train::ElasticEngine over this rank's parallel::ElasticContext, and the test and benchmark
// flags (--debug-kill-rank, --debug-kill-in-regroup, --debug-await-join, --debug-sample-log,
// --debug-slow-rank) as the context's hook and fit's callbacks.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "cli/train_loop.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/parallel/elastic.h"
#include "kolo/settings.h"
#include "kolo/train/elastic.h"
#include "kolo/train/faults.h"

namespace kolo::cli {
namespace {

// Where a --debug-kill-rank rank of an elastic job writes the moment of its kill (for
// since_kill_s).
constexpr const char* kKillMomentKey = "kolo-elastic/debug-kill-ns";

int64_t wallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<comm::Store> connectJobStore() {
  return comm::connectTcpStore(settings::store(), settings::token(), std::chrono::seconds(10));
}

// The elastic engine's options: engineOptions' multi-worker-mirrored over the members; the
// recovered event gains since_kill_s where a --debug-kill-rank rank recorded its moment.
// `comm`: generation 0's communicator (the engine uses each generation's).
train::ElasticEngineOptions elasticOptions(const TrainConfig& config, observe::Logger& logger,
                                           std::shared_ptr<comm::Communicator> comm) {
  train::ElasticEngineOptions options;
  options.dataParallel = engineOptions(config, std::move(comm));
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

// --debug-sample-log FILE under kolo run --elastic: FILE.rank-ID gets a `pid` line, then
// `GENERATION STEP ID...` for each step this rank completes (the samples it trained on).
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

// The hooks of an elastic job's test flags, before each step in the order the members agree
// on it: a failure and a slow rank's sleep (train::injectFaults), a --debug-kill-rank kill
// that records its moment, the wait for a joiner; after it the sample log.
}  // namespace

train::FitCallbacks elasticHooks(const TrainConfig& config, train::ElasticEngine& engine) {
  parallel::ElasticContext& context = engine.context();
  const int id = context.id();
  train::FitCallbacks hooks;
  hooks.onStepBegin = [&config, &context, id](int64_t step) {
    const train::FaultPlan::Kill& kill = config.faults.kill;
    if (step == kill.step &&
        std::find(kill.ranks.begin(), kill.ranks.end(), id) != kill.ranks.end()) {
      std::fflush(nullptr);
      connectJobStore()->setString(kKillMomentKey, std::to_string(wallNanos()));
      ::raise(kill.signal);
    }
    if (step == config.debugAwaitJoin && context.size() < context.maxRanks())
      context.awaitJoiners(std::chrono::minutes(5));
  };
  auto sampleLog = std::make_shared<SampleLog>(config.debugSampleLog, id);
  hooks.onStepEnd = [sampleLog, &engine](const train::StepEnd& end) {
    sampleLog->write(engine, end);
  };
  train::FaultPlan faults = config.faults;
  faults.kill = {};  // the hook above's
  return train::injectFaults(faults, id, hooks);
}

std::unique_ptr<train::ElasticEngine> makeElasticEngine(const TrainConfig& config,
                                                        parallel::OptimizerFactory optimizers,
                                                        observe::Logger& logger) {
  parallel::ElasticOptions membership;
  if (config.debugKillInRegroup >= 0)
    membership.onAgreed = [&config](int64_t) {
      if (settings::rank() == config.debugKillInRegroup) {
        std::fflush(nullptr);
        ::raise(SIGKILL);
      }
    };
  // A rank started in a lost one's place returns once a generation admitted it, or null
  // when the job finished first.
  std::shared_ptr<parallel::ElasticContext> context =
      parallel::ElasticContext::fromEnvironment(membership);
  if (!context) {
    logger.info("elastic: the job finished before this rank was admitted", {{"rank", *settings::rank()}});
    return nullptr;
  }
  return std::make_unique<train::ElasticEngine>(
      context, [&config] { return buildModel(config); }, std::move(optimizers),
      elasticOptions(config, logger, context->communicator()));
}

}  // namespace kolo::cli
