// The Trainer's set-up: recipe defaults, optimizer and schedule, the data, the job's
// communicator and the strategy; evaluation and one training step. The loop itself
// (epochs, metrics, checkpoints, resume) is in train_run.cc.
#include "cli/train_loop.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/train_compress.h"
#include "kolo/autograd.h"
#include "kolo/comm/init.h"
#include "kolo/memory.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/safetensors.h"
#include "kolo/threads.h"

namespace kolo::cli {

std::shared_ptr<data::TensorDataset> loadTrainingSet(const TrainConfig& config) {
  // Only the samples used are read: a short run does not inflate the whole split.
  return std::make_shared<data::FashionMnist>(config.dataDir, true, config.trainLimit);
}

void refuseFlags(const TrainConfig& config, const std::vector<std::string>& flags,
                 const std::string& what, const std::string& where, const std::string& hint) {
  std::vector<std::string> given;
  for (const std::string& flag : flags)
    if (config.givenFlags.count(flag)) given.push_back(flag);
  if (given.empty()) return;
  std::string names = given.front();
  for (size_t i = 1; i < given.size(); ++i)
    names += (i + 1 == given.size() ? " and " : ", ") + given[i];
  KOLO_THROW(InvalidArgument, names, given.size() == 1 ? " sets " : " set ", what,
             "; not available with ", where, hint);
}

void refuseReducerFlags(const TrainConfig& config, const std::string& where,
                        const std::string& hint) {
  refuseFlags(config, kReducerFlags, "multi-worker-mirrored's reducer", where, hint);
}

void killIfAsked(const TrainConfig& config, int rank, int64_t step) {
  if (step != config.debugKillStep ||
      std::find(config.debugKillRanks.begin(), config.debugKillRanks.end(), rank) ==
          config.debugKillRanks.end())
    return;
  std::fflush(nullptr);
  ::raise(config.debugKillSignal);
}

Recipe resolveRecipe(const TrainConfig& config, int64_t stepsPerEpoch) {
  KOLO_REQUIRE(config.model == "mlp" || config.model == "cnn" || config.model == "lm", "--model '",
               config.model, "' is not accepted: use mlp, cnn or lm");
  KOLO_REQUIRE(config.batch > 0, "--batch must be at least 1, got ", config.batch);
  KOLO_REQUIRE(config.steps >= 0, "--steps must be at least 0, got ", config.steps);
  Recipe recipe;
  // The default recipe (neither --optimizer nor --lr): Nesterov SGD, momentum 0.9, lr 0.1
  // for the mlp and 0.05 for the cnn, warm-up + cosine over 10 epochs.
  const bool defaultRecipe = !config.optimizer && !config.lr;
  recipe.optimizer = config.optimizer.value_or("sgd");
  KOLO_REQUIRE(recipe.optimizer == "sgd" || recipe.optimizer == "adam" || recipe.optimizer == "adamw",
               "--optimizer '", recipe.optimizer, "' is not accepted: use sgd, adam or adamw");
  if (recipe.optimizer == "sgd") {
    const bool mlp = config.model == "mlp";
    // Without --lr: the default recipe's rates, or the peers' constant-rate recipe's.
    recipe.lr = config.lr.value_or(defaultRecipe ? (mlp ? 0.1 : 0.05) : (mlp ? 0.05 : 0.02));
    recipe.momentum = config.momentum.value_or(0.9);
    recipe.nesterov = config.nesterov || defaultRecipe;
    KOLO_REQUIRE(!config.beta1, "--beta1 applies to --optimizer adam and adamw, not sgd");
  } else {
    recipe.lr = config.lr.value_or(1e-3);
    KOLO_REQUIRE(!config.momentum && !config.nesterov, "--momentum and --nesterov apply to "
                 "--optimizer sgd only, not ", recipe.optimizer);
    recipe.beta1 = config.beta1.value_or(0.9);
    KOLO_REQUIRE(recipe.beta1 >= 0.0 && recipe.beta1 < 1.0, "--beta1 must be in [0, 1), got ",
                 recipe.beta1);
  }
  recipe.weightDecay = config.weightDecay.value_or(recipe.optimizer == "adamw" ? 0.01 : 0.0);
  recipe.epochs = config.epochs.value_or(10);
  KOLO_REQUIRE(recipe.epochs > 0, "--epochs must be at least 1, got ", recipe.epochs);
  KOLO_REQUIRE(recipe.lr > 0.0 && std::isfinite(recipe.lr), "--lr must be above 0, got ", recipe.lr);
  recipe.schedule = config.schedule;
  if (recipe.schedule == "auto") recipe.schedule = config.lr ? "constant" : "warmup-cosine";
  KOLO_REQUIRE(recipe.schedule == "constant" || recipe.schedule == "cosine" ||
                   recipe.schedule == "warmup-cosine" || recipe.schedule == "step",
               "--schedule '", config.schedule,
               "' is not accepted: use auto, constant, cosine, warmup-cosine or step");
  recipe.warmupSteps =
      config.warmupSteps.value_or(recipe.schedule == "warmup-cosine" ? stepsPerEpoch / 2 : 0);
  KOLO_REQUIRE(recipe.warmupSteps >= 0, "--warmup-steps must be at least 0, got ", recipe.warmupSteps);
  return recipe;
}

std::unique_ptr<optim::Optimizer> makeOptimizer(const Recipe& recipe,
                                                const optim::NamedParameters& parameters) {
  if (recipe.optimizer == "sgd") {
    return std::make_unique<optim::Sgd>(parameters,
                                        optim::SgdOptions{.lr = recipe.lr,
                                                          .momentum = recipe.momentum,
                                                          .weightDecay = recipe.weightDecay,
                                                          .nesterov = recipe.nesterov});
  }
  optim::AdamOptions options{.lr = recipe.lr, .beta1 = recipe.beta1,
                             .weightDecay = recipe.weightDecay};
  if (recipe.optimizer == "adamw") return optim::makeAdamW(parameters, options);
  return std::make_unique<optim::Adam>(parameters, options);
}

std::unique_ptr<optim::LrSchedule> makeSchedule(const Recipe& recipe, int64_t totalSteps) {
  totalSteps = std::max<int64_t>(totalSteps, 1);
  if (recipe.schedule == "constant") return std::make_unique<optim::ConstantLr>(recipe.lr);
  if (recipe.schedule == "step") {
    // Decay by 10x at 50% and 75% would need a multi-step schedule; one decay per third.
    return std::make_unique<optim::StepLr>(recipe.lr, std::max<int64_t>(totalSteps / 3, 1), 0.3);
  }
  const int64_t warmup =
      recipe.schedule == "warmup-cosine" ? std::min(recipe.warmupSteps, totalSteps) : 0;
  auto cosine =
      std::make_unique<optim::CosineLr>(recipe.lr, std::max<int64_t>(totalSteps - warmup, 1));
  if (warmup == 0) return cosine;
  return std::make_unique<optim::WarmupLr>(std::move(cosine), warmup);
}

int64_t countCorrect(nn::Module& model, const data::TensorDataset& dataset, int64_t begin,
                     int64_t end, int64_t chunk) {
  autograd::NoGradGuard noGrad;
  model.train(false);
  int64_t correct = 0;
  for (int64_t from = begin; from < end; from += chunk) {
    const int64_t to = std::min(from + chunk, end);
    Tensor logits = model.forward(dataset.inputs().slice(0, from, to)).contiguous();  // (b, C)
    const std::vector<double> labels = dataset.labels().slice(0, from, to).toDoubleVector();
    const int64_t classes = logits.size(1);
    const float* values = logits.data<float>();
    for (int64_t i = 0; i < to - from; ++i) {
      const float* row = values + i * classes;
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (row[c] > row[best]) best = c;
      }
      correct += best == static_cast<int64_t>(labels[i]);
    }
  }
  return correct;
}

double evaluateAccuracy(nn::Module& model, const data::TensorDataset& dataset, int64_t chunk) {
  const int64_t n = dataset.size();
  const int64_t correct = countCorrect(model, dataset, 0, n, chunk);
  return n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0.0;
}

namespace {

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

// --init names the user's file: not finding it, or weights that do not fit the model, is an
// input-file error (exit code 3), like a malformed file.
void loadInitialWeights(const std::string& path, nn::Module& model) {
  try {
    checkpoint::loadSafetensorsInto(path, model.stateDict());
  } catch (const FileError&) {
    throw;
  } catch (const IoError& e) {
    throw FileError(e.what());
  } catch (const InvalidArgument& e) {
    throw FileError(e.what());
  }
}

}  // namespace

int shardGroupSize(const TrainConfig& config, int worldSize) {
  KOLO_REQUIRE(!config.hsdp || config.shardGroup == 0, "--hsdp sets the shard group to the ranks "
               "of one host; give it or --shard-group ", config.shardGroup, ", not both");
  const int group = config.hsdp ? std::max(1, comm::detectLaunch().localSize) : config.shardGroup;
  KOLO_REQUIRE(group == 0 || worldSize % group == 0, config.hsdp ? "--hsdp: " : "",
               "a shard group of ", group, " ranks does not divide the job's ", worldSize,
               " ranks");
  return group;
}

Trainer::Trainer(TrainConfig config, observe::Logger& logger)
    : config_(std::move(config)), logger_(logger) {
  const parallel::StrategyKind kind = parallel::parseStrategyKind(config_.strategy);
  KOLO_REQUIRE(config_.threads >= 1, "--threads must be at least 1, got ", config_.threads);
  KOLO_REQUIRE(config_.clipNorm == 0.0 || kind == parallel::StrategyKind::OneDevice ||
                   kind == parallel::StrategyKind::FullyShardedDataParallel,
               "--clip-norm is available with --strategy one-device and fsdp only, not ",
               config_.strategy);
  KOLO_REQUIRE(config_.replicas >= 1, "--replicas must be at least 1, got ", config_.replicas);
  KOLO_REQUIRE(config_.bucketMb > 0 && config_.firstBucketMb > 0,
               "--bucket-mb and --first-bucket-mb must be above 0, got ", config_.bucketMb, " and ",
               config_.firstBucketMb);
  for (const auto& [flag, value] : {std::pair{"--overlap", &config_.overlap},
                                     std::pair{"--shard-optimizer", &config_.shardOptimizer},
                                     std::pair{"--prefetch", &config_.prefetch}}) {
    KOLO_REQUIRE(*value == "auto" || *value == "on" || *value == "off", flag, " '", *value,
                 "' is not accepted: use auto, on or off");
  }
  KOLO_REQUIRE(config_.checkpointEvery >= 0, "--checkpoint-every must be at least 0, got ",
               config_.checkpointEvery);
  KOLO_REQUIRE(config_.keepCheckpoints >= 1, "--keep-checkpoints must be at least 1, got ",
               config_.keepCheckpoints);
  KOLO_REQUIRE(config_.trainLimit >= 0, "--train-limit must be at least 0, got ", config_.trainLimit);
  KOLO_REQUIRE(config_.timingSkip >= 0, "--timing-skip must be at least 0, got ", config_.timingSkip);
  const bool compress = checkCompression(config_.compress, kind);
  // A communication hook replaces the all-reduce that the sharded update reads around.
  KOLO_REQUIRE(!compress || config_.shardOptimizer != "on", "--compress ", config_.compress,
               " cannot be combined with --shard-optimizer on");
  if (kind == parallel::StrategyKind::FullyShardedDataParallel) {
    KOLO_REQUIRE(config_.checkSync == 0 && config_.debugPerturb.empty(),
                 "--check-sync and --debug-perturb are not available with --strategy fsdp");
    // fsdp reduce-scatters each unit as its backward ends and updates its own shard: the
    // reducer's buckets, overlap and sharded update do not exist there.
    refuseFlags(config_, {"--overlap", "--shard-optimizer", "--bucket-mb", "--first-bucket-mb"},
                "multi-worker-mirrored's reducer", "--strategy fsdp",
                " (it reduce-scatters each unit during backward and updates only its shard)");
  } else {
    KOLO_REQUIRE(config_.shardGroup == 0 && !config_.hsdp && config_.unitParams == 0,
                 "--shard-group, --hsdp and --unit-params need --strategy fsdp, not ",
                 config_.strategy);
  }
  setNumThreads(config_.threads);
  // Validate the flags before the (slow) data loading and before joining the job.
  recipe_ = resolveRecipe(config_, 1);
  const bool inProcessReplicas =
      kind == parallel::StrategyKind::Mirrored || kind == parallel::StrategyKind::CentralStorage;
  const int localReplicas = inProcessReplicas ? config_.replicas : 1;

  train_ = loadTrainingSet(config_);
  test_ = std::make_shared<data::FashionMnist>(config_.dataDir, false);

  if (kind == parallel::StrategyKind::MultiWorkerMirrored ||
      kind == parallel::StrategyKind::FullyShardedDataParallel)
    comm_ = parallel::init();
  const int worldSize = comm_ ? comm_->size() : 1;
  if (config_.balance) {
    KOLO_REQUIRE(kind == parallel::StrategyKind::MultiWorkerMirrored,
                 "--balance is available with --strategy multi-worker-mirrored, not ", config_.strategy);
    balancer_ = std::make_unique<parallel::Balancer>(
        config_.batch, comm_->rank(), worldSize, parallel::BalancerOptions{.replanEvery = config_.balanceEvery});
  } else {
    KOLO_REQUIRE(config_.batch % (worldSize * localReplicas) == 0, "--batch ", config_.batch,
                 " does not split evenly over ", worldSize * localReplicas, " replicas (", worldSize,
                 " rank(s) x ", localReplicas, " per rank): use a multiple of ",
                 worldSize * localReplicas);
  }
  const int64_t n = train_->size();
  stepsPerEpoch_ = config_.dropLast ? n / config_.batch : (n + config_.batch - 1) / config_.batch;
  KOLO_REQUIRE(stepsPerEpoch_ > 0, "--batch ", config_.batch, " is larger than the ", n,
               " training samples (with --drop-last no step is left; use --pad-last)");
  recipe_ = resolveRecipe(config_, stepsPerEpoch_);
  // --steps is the total step count: it cuts --epochs short, or alone sets the length.
  totalSteps_ = recipe_.epochs * stepsPerEpoch_;
  if (config_.steps > 0)
    totalSteps_ = config_.epochs ? std::min(totalSteps_, config_.steps) : config_.steps;

  parallel::StrategyOptions options = parallel::strategyOptionsFromNames(
      config_.strategy, config_.replicas, config_.reduction, config_.algorithm, comm_);
  options.reducer.bucketCapBytes = static_cast<size_t>(config_.bucketMb * (1 << 20));
  options.reducer.firstBucketCapBytes = static_cast<size_t>(config_.firstBucketMb * (1 << 20));
  options.reducer.overlap = onOrSpareCore(config_.overlap, localReplicas * config_.threads);
  options.reducer.shardOptimizer =
      config_.shardOptimizer == "on" ||
      (config_.shardOptimizer == "auto" && config_.algorithm == "auto" && !options.reducer.overlap);
  options.shard = parallel::parseShardLevel(config_.shard);
  if (kind == parallel::StrategyKind::FullyShardedDataParallel) {
    options.shardGroup = shardGroupSize(config_, worldSize);
    options.clipNorm = config_.clipNorm;
    options.unitMinParameters = config_.unitParams;
  }
  if (compress) options.reducer.shardOptimizer = false;
  prefetch_ = onOrSpareCore(config_.prefetch, localReplicas * config_.threads) ? 2 : 0;
  // Every replica starts from the same seeded init (or --init file); the strategy also
  // copies replica 0's (rank 0's) weights to the others.
  auto models = [this]() -> std::shared_ptr<nn::Module> {
    Generator generator(config_.seed);
    std::shared_ptr<nn::Module> model = nn::makeModel(config_.model, generator);
    if (!config_.initPath.empty()) loadInitialWeights(config_.initPath, *model);
    return model;
  };
  auto optimizers = [this](const parallel::NamedTensors& parameters) {
    return makeOptimizer(recipe_, parameters);
  };
  tensorBase_ = liveTensorBytes();
  strategy_ = parallel::makeStrategy(options, models, optimizers,
                                     balancer_ ? balancer_->weightedLoss() : parallel::LossFn());
  installCompression(config_.compress, *strategy_);
  if (!config_.initPath.empty() && isPrimary())
    logger_.info("loaded initial weights", {{"file", config_.initPath}});
  schedule_ = makeSchedule(recipe_, totalSteps_);
}

Trainer::~Trainer() = default;

std::shared_ptr<data::Sampler> Trainer::makeSampler(int64_t trainSize) const {
  // --balance: every rank reads the whole global batch and trains on its share of it.
  return std::make_shared<data::DistributedSampler>(
      trainSize, data::DistributedSamplerOptions{.globalBatch = config_.batch,
                                                 .rank = balancer_ ? 0 : strategy_->dataRank(),
                                                 .worldSize = balancer_ ? 1 : strategy_->dataWorldSize(),
                                                 .shuffle = config_.shuffle,
                                                 .seed = config_.seed,
                                                 .dropLast = config_.dropLast});
}

double Trainer::trainStep(const data::Batch& batch, double lr) {
  if (config_.clipNorm > 0.0 && strategy_->kind() == parallel::StrategyKind::OneDevice) {
    // The update needs the clipped gradients (fsdp clips inside its step).
    nn::Module& net = model();
    net.train(true);
    Tensor loss = crossEntropy(net.forward(batch.inputs), batch.labels);
    optimizer().zeroGrad();
    loss.backward();
    std::vector<Tensor> parameters;
    for (auto& [name, parameter] : net.namedParameters()) parameters.push_back(parameter);
    optim::clipGradNorm(parameters, config_.clipNorm);
    optimizer().setLr(lr);
    optimizer().step();
    return loss.item();
  }
  strategy_->setLr(lr);
  return strategy_->trainStep(batch.inputs, batch.labels).loss;
}

double Trainer::evaluate() {
  const int64_t n = test_->size();
  const int size = comm_ ? comm_->size() : 1;
  const int64_t begin = n * rank() / size;
  const int64_t end = n * (rank() + 1) / size;
  strategy_->gatherModel();  // fsdp: whole parameters for the forward passes below
  const double mine = static_cast<double>(countCorrect(model(), *test_, begin, end));
  double correct = mine;
  if (size > 1) comm_->allreduce(&mine, &correct, 1, DType::F64, comm::ReduceOp::Sum);
  model().train(true);
  return n > 0 ? correct / static_cast<double>(n) : 0.0;
}

}  // namespace kolo::cli
