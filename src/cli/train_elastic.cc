// `kolo train --strategy multi-worker-mirrored` under `kolo run --elastic`: the loop keeps
// the state after each of the last two completed steps in memory; when a step fails with
// PeerError or Timeout, the survivors regroup (parallel::ElasticContext), rebuild the
// strategy over the new communicator from the state after the step every member completed,
// and slice the same global batches over the new world: each global batch is still the
// same samples in the same order, so the updates are those of one device. With --balance
// each generation splits the global batch by its members' speed (parallel::Balancer).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/train_loop.h"
#include "cli/train_model_state.h"
#include "kolo/comm/stores.h"
#include "kolo/checkpoint.h"
#include "kolo/error.h"
#include "kolo/nn/models.h"
#include "kolo/observe.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/elastic.h"
#include "kolo/safetensors.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/evaluate.h"
#include "train/balance.h"

namespace kolo::cli {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t wallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The model and optimizer state after some number of completed steps.
struct Snapshot {
  int64_t step = -1;
  std::vector<std::pair<std::string, Tensor>> weights;
  optim::StateDict optimizer;
};

Snapshot take(parallel::Strategy& strategy, int64_t step) {
  Snapshot s;
  s.step = step;
  for (auto& [name, tensor] : strategy.model().stateDict()) s.weights.emplace_back(name, tensor.clone());
  s.optimizer = strategy.optimizer().stateDict();
  return s;
}

// The checkpoint of the state after `step` steps, the files a run without --elastic writes
// (weights, optimizer state, loader position, and the model, batch and seed it was trained
// with), so that `kolo train --resume` continues it with or without --elastic. Returns its
// directory.
std::string writeCheckpoint(const TrainConfig& config, int64_t stepsPerEpoch, int64_t step,
                            int replicas, nn::Module& model, optim::Optimizer& optimizer,
                            observe::Logger& logger) {
  checkpoint::TrainingState state;
  state.step = step;
  state.epoch = step / stepsPerEpoch;
  state.loader = {step / stepsPerEpoch, step % stepsPerEpoch};
  state.extra = runIdentity(config);
  state.extra["strategy"] = config.strategy;
  state.extra["replicas"] = std::to_string(replicas);
  checkpoint::CheckpointManager manager(config.checkpointDir, config.keepCheckpoints, true,
                                        [&logger](const std::string& line) { logger.warn(line); });
  return manager.save(model.stateDict(), &optimizer, state);
}

// The job fell below --min-ranks after `change.step` steps: the first member writes the
// state after that step as a checkpoint that `kolo train --resume` continues, then every
// member stops with the error. A model and optimizer of this process take the snapshot
// (the strategy is gone with its communicator).
void saveBeforeStopping(const TrainConfig& config, const Recipe& recipe, int64_t stepsPerEpoch,
                        const parallel::MembershipChange& change, int id, const Snapshot& last,
                        const Snapshot& before, observe::Logger& logger) {
  if (config.checkpointDir.empty() || change.members.empty() || change.members.front() != id) return;
  const Snapshot* from = change.step == last.step ? &last : change.step == before.step ? &before : nullptr;
  KOLO_CHECK(from != nullptr, "elastic rank ", id, ": no state after step ", change.step,
             " to checkpoint (it holds steps ", before.step, " and ", last.step, ")");
  Generator generator(config.seed);
  std::shared_ptr<nn::Module> model = nn::makeModel(config.model, generator);
  model->loadStateDict(from->weights, "the elastic snapshot");
  std::unique_ptr<optim::Optimizer> optimizer = makeOptimizer(recipe, model->namedParameters());
  optimizer->loadStateDict(parallel::conformStateShapes(from->optimizer, *optimizer));
  const std::string path = writeCheckpoint(config, stepsPerEpoch, change.step,
                                           static_cast<int>(change.members.size()), *model, *optimizer, logger);
  logger.warn("elastic: checkpoint written before stopping", {{"dir", path}, {"step", change.step}});
}

std::string idList(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) {
    if (!text.empty()) text += ',';
    text += std::to_string(id);
  }
  return text;
}

}  // namespace

int runElasticTraining(const TrainConfig& config, observe::Logger& logger) {
  KOLO_REQUIRE(config.strategy == "multi-worker-mirrored",
               "kolo run --elastic trains with --strategy multi-worker-mirrored, not --strategy ",
               config.strategy);
  KOLO_REQUIRE(config.initPath.empty() && config.clipNorm == 0.0 && !config.detectAnomaly &&
                   config.checkSync == 0,
               "--init, --clip-norm, --detect-anomaly and --check-sync are not available under kolo "
               "run --elastic");
  KOLO_REQUIRE(config.checkpointEvery >= 0, "--checkpoint-every must be at least 0, got ",
               config.checkpointEvery);
  KOLO_REQUIRE(config.threads >= 1, "--threads must be at least 1, got ", config.threads);
  setNumThreads(config.threads);
  Recipe recipe = resolveRecipe(config, 1);
  std::shared_ptr<data::TensorDataset> train = loadTrainingSet(config);
  auto test = std::make_shared<data::FashionMnist>(config.dataDir, false);
  const int64_t n = train->size();
  const int64_t stepsPerEpoch = config.dropLast ? n / config.batch : (n + config.batch - 1) / config.batch;
  KOLO_REQUIRE(stepsPerEpoch > 0, "--batch ", config.batch, " is larger than the ", n, " training samples");
  recipe = resolveRecipe(config, stepsPerEpoch);
  int64_t totalSteps = recipe.epochs * stepsPerEpoch;
  if (config.steps > 0) totalSteps = config.epochs ? std::min(totalSteps, config.steps) : config.steps;
  std::unique_ptr<optim::LrSchedule> schedule = makeSchedule(recipe, totalSteps);

  parallel::ElasticOptions elasticOptions;
  if (config.debugKillInRegroup >= 0)
    elasticOptions.onAgreed = [&config](int64_t) {
      if (settings::rank() == config.debugKillInRegroup) {
        std::fflush(nullptr);
        ::raise(SIGKILL);
      }
    };
  std::unique_ptr<parallel::ElasticContext> elastic =
      parallel::ElasticContext::fromEnvironment(std::move(elasticOptions));
  // A rank started in a lost one's place has joined here (it waited for a step boundary of
  // the members), or found the job finished.
  const bool joiner = settings::elasticJoin();
  if (!elastic) {
    logger.info("elastic: the job finished before this rank was admitted", {{"rank", *settings::rank()}});
    return 0;
  }
  const int id = elastic->id();
  // Generation 0's setup and first step may be slow on a loaded machine (rings are made on
  // first use): they get the rendezvous's time, the detection deadline applies after them.
  const std::chrono::milliseconds deadline = elastic->communicator()->timeout();
  if (!joiner)
    elastic->communicator()->setTimeout(std::max<std::chrono::milliseconds>(deadline, std::chrono::minutes(5)));
  const bool killedHere = std::find(config.debugKillRanks.begin(), config.debugKillRanks.end(), id) !=
                          config.debugKillRanks.end();
  // --balance: each generation splits the global batch by its members' measured speed (any
  // batch of at least one sample per rank); without it, evenly.
  std::unique_ptr<parallel::Balancer> balancer;
  auto startGeneration = [&] {
    if (config.balance) {
      balancer = std::make_unique<parallel::Balancer>(
          config.batch, elastic->rank(), elastic->size(),
          parallel::BalancerOptions{.replanEvery = config.balanceEvery});
      return;
    }
    KOLO_REQUIRE(config.batch % elastic->size() == 0, "elastic job: --batch ", config.batch,
                 " does not split evenly over the ", elastic->size(), " rank(s) of generation ",
                 elastic->generation(), "; use a batch that every world size from --min-ranks ",
                 elastic->minRanks(), " to --max-ranks ", elastic->maxRanks(), " divides (or --balance)");
  };
  auto makeStrategy = [&] {
    parallel::StrategyOptions options = parallel::strategyOptionsFromNames(
        config.strategy, 1, config.reduction, config.algorithm, elastic->communicator());
    options.reducer.bucketCapBytes = static_cast<size_t>(config.bucketMb * (1 << 20));
    options.reducer.firstBucketCapBytes = static_cast<size_t>(config.firstBucketMb * (1 << 20));
    // A failed step must leave every rank's state whole: no update sharded across ranks,
    // and the all-reduce after backward.
    options.reducer.overlap = false;
    options.reducer.shardOptimizer = false;
    auto models = [&config]() -> std::shared_ptr<nn::Module> {
      Generator generator(config.seed);
      return nn::makeModel(config.model, generator);
    };
    auto optimizers = [&recipe](const parallel::NamedTensors& parameters) {
      return makeOptimizer(recipe, parameters);
    };
    return parallel::makeStrategy(options, models, optimizers,
                                  balancer ? balancer->weightedLoss() : parallel::LossFn());
  };
  auto makeLoader = [&](int64_t step) {
    // With --balance every rank reads the whole global batch and trains on its share.
    auto sampler = std::make_shared<data::DistributedSampler>(
        n, data::DistributedSamplerOptions{.globalBatch = config.batch,
                                           .rank = balancer ? 0 : elastic->rank(),
                                           .worldSize = balancer ? 1 : elastic->size(),
                                           .shuffle = config.shuffle,
                                           .seed = config.seed,
                                           .dropLast = config.dropLast});
    auto loader = std::make_unique<data::DataLoader>(
        train, sampler, data::DataLoaderOptions{.batchSize = balancer ? config.batch : config.batch / elastic->size(),
                                              .prefetch = 0});
    loader->setState({step / stepsPerEpoch, step % stepsPerEpoch});
    return loader;
  };

  std::unique_ptr<parallel::Strategy> strategy;
  std::unique_ptr<data::DataLoader> loader;
  std::unique_ptr<observe::MetricsWriter> metrics;
  bool metricsOpened = false;
  auto openMetrics = [&] {
    // The primary (rank 0 of the current generation) writes; a new primary appends.
    if (metrics || elastic->rank() != 0 || config.metricsPath.empty()) return;
    metrics = std::make_unique<observe::MetricsWriter>(config.metricsPath, metricsOpened || elastic->generation() > 0);
    metricsOpened = true;
  };
  Snapshot before, last;  // the states after before.step and last.step completed steps
  int64_t step = 0;
  // A new generation's start: its strategy from `from` (this member's state after the
  // agreed step; null for a joiner, which holds none), then every member takes rank 0's
  // weights, optimizer state and step by broadcast over the new communicator; the sampler's
  // position follows from the step.
  auto adopt = [&](const Snapshot* from, int64_t agreedStep) {
    startGeneration();
    strategy = makeStrategy();
    if (from) {
      strategy->model().loadStateDict(from->weights, "the elastic snapshot");
      strategy->optimizer().loadStateDict(parallel::conformStateShapes(from->optimizer, strategy->optimizer()));
    }
    strategy->syncReplicas();
    int64_t rootStep = agreedStep;
    elastic->communicator()->broadcast(&rootStep, 1, DType::I64, 0);
    step = rootStep;
    last = take(*strategy, step);
    before = Snapshot{};
    loader = makeLoader(step);
    metrics.reset();
    openMetrics();
  };
  int64_t firstStep = 0;  // where this run started (--resume: the checkpoint's step)
  if (joiner) {
    adopt(nullptr, elastic->change().step);
  } else {
    startGeneration();
    strategy = makeStrategy();
    if (!config.resumeDir.empty()) {
      // Every member reads the newest good checkpoint that rank 0 picked (one node: the
      // same files).
      firstStep = step = resumeModelPart(
          config, elastic->communicator().get(),
          ModelPart{.module = &strategy->model(), .specs = {}, .optimizer = &strategy->optimizer()}, logger);
    }
    loader = makeLoader(step);
    metricsOpened = step > 0;  // a resumed run continues the file
    openMetrics();
    last = take(*strategy, step);
  }
  // --checkpoint-dir: every --checkpoint-every steps and at the end, by rank 0 of the
  // generation (the lowest launch rank: every member holds the same state).
  int64_t lastCheckpoint = step;
  auto checkpointAfter = [&](int64_t completed) {
    if (config.checkpointDir.empty() || elastic->rank() != 0) return;
    const std::string path = writeCheckpoint(config, stepsPerEpoch, completed, elastic->size(),
                                             strategy->model(), strategy->optimizer(), logger);
    logger.info("elastic: checkpoint written", {{"dir", path}, {"step", completed}});
    lastCheckpoint = completed;
  };
  std::ofstream sampleLog;
  if (!config.debugSampleLog.empty()) {
    const std::string path = config.debugSampleLog + ".rank-" + std::to_string(id);
    sampleLog.open(path, std::ios::trunc);
    KOLO_REQUIRE(sampleLog.good(), "--debug-sample-log: cannot write ", path);
    sampleLog << "pid " << ::getpid() << '\n' << std::flush;  // one process throughout
  }
  const auto start = Clock::now();
  if (elastic->rank() == 0 && !joiner)
    logger.info("elastic training", {{"model", config.model},
                                     {"batch", config.batch},
                                     {"steps", totalSteps},
                                     {"world_size", elastic->size()},
                                     {"min_ranks", elastic->minRanks()},
                                     {"max_ranks", elastic->maxRanks()}});
  if (joiner)
    logger.info("elastic: joined", {{"rank", id}, {"generation", elastic->generation()},
                                    {"world_size", elastic->size()}, {"step", step}});
  auto event = [&](observe::Fields fields) {
    if (!metrics) return;
    fields.set("kind", "event");
    fields.set("wall_s", secondsSince(start));
    metrics->write(fields);
  };
  if (!joiner)
    event({{"event", firstStep > 0 ? "resume" : "start"}, {"step", step}, {"world_size", elastic->size()},
           {"generation", elastic->generation()}, {"batch", config.batch}});

  // Every member agrees on the next generation (after a failed step, or to admit joiners),
  // goes back to the state after the step every member completed and hands it to the
  // joiners.
  auto changeMembership = [&](const std::string& reason) {
    strategy.reset();  // its loss refers to the balancer
    balancer.reset();
    loader.reset();
    parallel::MembershipChange change;
    for (std::string why = reason;;) {
      try {
        change = elastic->regroup(step, why);
      } catch (const parallel::BelowMinRanksError& stop) {
        saveBeforeStopping(config, recipe, stepsPerEpoch, stop.change(), id, last, before, logger);
        throw;
      }
      // The state after `step` completed steps is `last`; one step behind is `before`.
      const Snapshot* from = change.step == last.step ? &last : change.step == before.step ? &before : nullptr;
      KOLO_CHECK(from != nullptr, "elastic rank ", id, ": the members agreed on step ", change.step,
                 " but this rank holds the states after steps ", before.step, " and ", last.step);
      try {
        adopt(from, change.step);
        break;
      } catch (const Error& e) {
        // A member failed (or timed out) while the state was handed over: agree again; this
        // rank's snapshots and step are as they were.
        if (!dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const Timeout*>(&e)) throw;
        logger.warn("elastic: handing over the state failed, regrouping", {{"rank", id}, {"error", e.what()}});
        strategy.reset();
        balancer.reset();
        loader.reset();
        why = e.what();
      }
    }
    if (elastic->rank() == 0)
      logger.warn("elastic: membership changed", {{"generation", change.generation},
                                                  {"lost_ranks", idList(change.lost)},
                                                  {"joined_ranks", idList(change.joined)},
                                                  {"world_size", elastic->size()},
                                                  {"members", idList(change.members)},
                                                  {"step", step}});
    if (!change.lost.empty())
      event({{"event", "membership"}, {"step", step}, {"generation", change.generation},
             {"world_size", elastic->size()}, {"lost", idList(change.lost)}});
    if (!change.joined.empty())
      event({{"event", "joined"}, {"step", step}, {"generation", change.generation},
             {"world_size", elastic->size()}, {"joined", idList(change.joined)}});
  };

  double lossSum = 0.0;
  int64_t lossCount = 0;
  // From the failure until the next step completes.
  bool recovering = false;
  Clock::time_point failedAt;
  train::detail::SlowRank slowRank(config.slowWorker, id, config.slowFactor);
  data::Batch batch, share;  // the loader's batch, and this rank's share of it
  while (step < totalSteps) {
    if (!loader->next(batch)) continue;  // the end of an epoch: the loader moves on
    if (killedHere && step == config.debugKillStep) {
      // Tests and benchmarks: the moment of the kill, for the recovery time.
      std::fflush(nullptr);
      auto store = comm::connectTcpStore(settings::store(), settings::token(), std::chrono::seconds(10));
      store->setString("kolo-elastic/debug-kill-ns", std::to_string(wallNanos()));
      ::raise(config.debugKillSignal);
    }
    double loss = 0.0, slept = 0.0, compute = 0.0;
    bool admit = false;
    try {
      // A step boundary: the members agree whether a joiner is waiting.
      if (step == config.debugAwaitJoin && elastic->size() < elastic->maxRanks())
        elastic->awaitJoiners(std::chrono::minutes(5));
      admit = elastic->joinerWaiting();
      if (!admit) {
        if (balancer) {
          train::detail::replanWhenDue(*balancer, *elastic->communicator(), step, elastic->rank() == 0, logger, metrics.get());
          share = train::detail::shareOf(batch, balancer->offset(), balancer->share());
        } else {
          share = batch;
        }
        slept = slowRank.sleepBeforeStep();
        const auto computeStart = Clock::now();
        strategy->setLr(schedule->lrAt(step));
        loss = strategy->trainStep(share.inputs, share.labels).loss;
        compute = train::detail::computeSeconds(secondsSince(computeStart), strategy->reducer());
      }
    } catch (const Error& e) {
      if (!dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const Timeout*>(&e)) throw;
      recovering = true;
      failedAt = Clock::now();
      logger.warn("elastic: step failed, regrouping",
                  {{"rank", id}, {"step", step}, {"generation", elastic->generation()}, {"error", e.what()}});
      changeMembership(e.what());
      continue;
    }
    if (admit) {
      changeMembership("rank(s) waiting to join");
      continue;
    }
    if (!std::isfinite(loss))
      KOLO_THROW(DivergedError, "training diverged: loss ", loss, " at step ", step, "; try a smaller --lr");
    if (sampleLog.is_open()) {
      sampleLog << elastic->generation() << ' ' << step;
      for (int64_t index : share.indices) sampleLog << ' ' << index;
      sampleLog << '\n' << std::flush;
    }
    slowRank.computed(compute);
    if (balancer) balancer->record(slept + compute);
    ++step;
    if (elastic->generation() == 0 && step == firstStep + 1) elastic->communicator()->setTimeout(deadline);
    before = std::move(last);
    last = take(*strategy, step);
    if (config.checkpointEvery > 0 && step % config.checkpointEvery == 0) checkpointAfter(step);
    lossSum += loss;
    ++lossCount;
    if (recovering) {
      const double recovery = secondsSince(failedAt);
      observe::Fields fields{{"event", "recovered"}, {"step", step}, {"generation", elastic->generation()},
                             {"world_size", elastic->size()}, {"recovery_s", recovery}};
      if (elastic->rank() == 0) {
        // Measured from the kill when a --debug-kill-rank rank recorded its moment.
        auto store = comm::connectTcpStore(settings::store(), settings::token(), std::chrono::seconds(10));
        if (store->check({"kolo-elastic/debug-kill-ns"})) {
          const double sinceKill =
              static_cast<double>(wallNanos() - std::stoll(store->getString("kolo-elastic/debug-kill-ns",
                                                                            std::chrono::seconds(1)))) / 1e9;
          fields.set("since_kill_s", sinceKill);
        }
        logger.info("elastic: recovered", fields);
      }
      event(fields);
      recovering = false;
    }
    if (metrics && config.metricsEvery > 0 && step % config.metricsEvery == 0)
      metrics->write({{"step", step}, {"train_loss", lossSum / lossCount}, {"world_size", elastic->size()},
                      {"generation", elastic->generation()}, {"wall_s", secondsSince(start)}});
  }
  if (elastic->rank() != 0) return 0;
  elastic->finish("training finished");  // ranks still waiting to join stop waiting
  if (lastCheckpoint != step) checkpointAfter(step);
  const double accuracy = train::evaluate(strategy->model(), *test).accuracy;
  if (!config.savePath.empty()) {
    checkpoint::saveSafetensors(config.savePath, strategy->model().stateDict(),
                                {{"format", "pt"}, {"model", config.model}, {"step", std::to_string(step)}});
    logger.info("saved weights", {{"file", config.savePath}});
  }
  const double wall = secondsSince(start);
  if (metrics)
    metrics->write({{"step", step}, {"train_loss", lossSum / std::max<int64_t>(lossCount, 1)},
                    {"test_accuracy", accuracy}, {"world_size", elastic->size()},
                    {"generation", elastic->generation()}, {"wall_s", wall}, {"final", true}});
  std::printf("test_accuracy %.4f train_loss %.4f steps %lld world_size %d generation %lld wall_s %.1f\n",
              accuracy, lossSum / std::max<int64_t>(lossCount, 1), static_cast<long long>(step),
              elastic->size(), static_cast<long long>(elastic->generation()), wall);
  std::fflush(stdout);
  return 0;
}

}  // namespace kolo::cli
