// `kolo train` with every strategy but parameter servers and federated learning: the flags
// mapped onto one train::Engine and train::fit. train::DataParallelEngine for one-device,
// mirrored, central-storage, multi-worker-mirrored and fsdp; train::ModelParallelEngine for
// pipeline, tensor, --mesh and the lm on one device; train::ElasticEngine under kolo run
// --elastic. The loop is the library's; what stays here is the command line's own: the run's
// data, the faults of the test flags, the per-rank report, the lm's held-out loss and text
// sample, --save and the summary line.
#include <algorithm>
#include <cstdio>

#include "cli/train_loop.h"
#include "kolo/byte_corpus.h"
#include "kolo/comm/init.h"
#include "kolo/memory.h"
#include "kolo/nn/language_model.h"
#include "kolo/parallel/compression.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/elastic.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/elastic.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"
#include "kolo/train/report.h"

namespace kolo::cli {
namespace {

// The default text of `--model lm`: the GNU GPL version 3, which Debian's base-files package
// installs on every system.
constexpr const char* kDefaultText = "/usr/share/common-licenses/GPL-3";
constexpr int64_t kDefaultLmSteps = 300;
constexpr int64_t kDefaultLmBatch = 16;

enum class Family { DataParallel, ModelParallel, Elastic };

Family familyOf(const TrainConfig& config) {
  if (parallel::ElasticContext::launchedElastic()) return Family::Elastic;
  if (config.strategy == "pipeline" || config.strategy == "tensor" || !config.mesh.empty() ||
      (config.model == "lm" && config.strategy == "one-device"))
    return Family::ModelParallel;  // the lm on one device: one stage, its micro-batches accumulate
  return Family::DataParallel;
}

// "on", "off", or for "auto" whether this node has a core to spare for communication or
// prefetching (a rank of mirrored or central storage runs a compute thread per replica).
bool onOrSpareCore(const std::string& choice, const TrainConfig& config) {
  if (choice != "auto") return choice == "on";
  const bool inProcess = config.strategy == "mirrored" || config.strategy == "central-storage";
  return comm::hasSpareCore((inProcess ? config.replicas : 1) * config.threads);
}

// The checks of combinations that the flag table (train_flags.cc), checking each flag on its
// own, cannot make. The lm and the model-parallel strategies: returns the mesh (--mesh, or
// --stages, or --tp), with config.strategy set to what --mesh implies and the lm's batch.
parallel::MeshShape checkModelParallelFlags(TrainConfig& config, Family family) {
  parallel::MeshShape shape{.dp = 1, .pp = config.stages, .tp = config.tp};
  if (!config.mesh.empty()) {
    // --mesh dp=D,pp=P,tp=T sets the strategy and its sizes: pipeline stages (split over
    // tensor groups when tp > 1), or tensor parallelism alone when pp = 1.
    shape = parallel::parseMeshShape(config.mesh);
    KOLO_REQUIRE(config.stages == 1 && config.tp == 1, "--mesh sets the stages and --tp; give one or the other");
    // --strategy fsdp with a mesh: the replicas of the tensor ranks are sharded (2-D fsdp x tp).
    if (config.strategy == "fsdp") {
      KOLO_REQUIRE(shape.pp == 1 && shape.dp > 1, "--strategy fsdp with --mesh shards the replicas of tensor "
                   "ranks, --mesh dp=D,tp=T with D > 1 and no pp; --mesh ", config.mesh, " is not");
      config.shardReplicas = true;
    }
    config.strategy = shape.pp == 1 && shape.tp > 1 ? "tensor" : "pipeline";
    config.stages = shape.pp;
    config.tp = shape.tp;
  }
  const bool lm = config.model == "lm";
  const bool tensor = config.strategy == "tensor";
  KOLO_REQUIRE(tensor || config.tp == 1 || !config.mesh.empty(), "--tp ", config.tp,
               " needs --strategy tensor (pipeline stages split over tensor groups: --mesh dp=1,pp=P,tp=T)");
  KOLO_REQUIRE(!(tensor || family == Family::DataParallel) || config.microBatches == 1, "--strategy ",
               config.strategy, " takes no --stages, --micro-batches or --split-at");
  KOLO_REQUIRE(tensor || config.tp > 1 || !config.sequenceParallel,
               "--sequence-parallel needs --strategy tensor (or a mesh with tp)");
  KOLO_REQUIRE(lm || !config.sequenceParallel, "--sequence-parallel works with --model lm only");
  KOLO_REQUIRE(config.clipNorm == 0.0 || config.strategy == "fsdp" || config.shardReplicas,
               "--clip-norm is not available with --model lm or --strategy pipeline or tensor, except under "
               "--strategy fsdp");
  if (lm && !config.givenFlags.count("--batch")) config.batch = kDefaultLmBatch;
  KOLO_REQUIRE(config.batch % (shape.dp * config.microBatches) == 0, "--batch ", config.batch,
               " cannot be split into ", shape.dp * config.microBatches, " equal micro-batches (", shape.dp,
               " replica(s) x ", config.microBatches, "): use a multiple of --micro-batches",
               shape.dp > 1 ? " times the mesh's dp" : "");
  return shape;
}

// Every family's checks (see checkModelParallelFlags); returns the mesh of the lm and the
// model-parallel strategies.
parallel::MeshShape checkFlags(TrainConfig& config, Family family) {
  if (family == Family::Elastic) {
    // multi-worker-mirrored without what one generation's replicas could not share.
    KOLO_REQUIRE(config.strategy == "multi-worker-mirrored",
                 "kolo run --elastic trains with --strategy multi-worker-mirrored, not --strategy ", config.strategy);
    KOLO_REQUIRE(config.initPath.empty() && config.clipNorm == 0.0 && !config.detectAnomaly && config.checkSync == 0,
                 "--init, --clip-norm, --detect-anomaly and --check-sync are not available under kolo run --elastic");
    // A failed step is rolled back to the last commit: the reducer overlapped with backward,
    // the sharded update and a compression hook's error feedback would not roll back with it.
    KOLO_REQUIRE(config.compress == "none" && config.overlap != "on" && config.shardOptimizer != "on",
                 "--compress, --overlap on and --shard-optimizer on are not available under kolo run --elastic "
                 "(a failed step is rolled back, which they would not follow)");
    return {};
  }
  parallel::MeshShape shape;
  if (config.model == "lm" || family == Family::ModelParallel) shape = checkModelParallelFlags(config, family);
  // A communication hook replaces the all-reduce that the sharded update reads around.
  KOLO_REQUIRE(family == Family::ModelParallel ||
                   parallel::compression::parseCompressSpec(config.compress).method == "none" ||
                   config.shardOptimizer != "on",
               "--compress ", config.compress, " cannot be combined with --shard-optimizer on");
  return shape;
}

// The run's data and length: the lm's text windows (the held-out loss is computed at the end)
// or Fashion-MNIST with its test split.
struct RunData {
  std::shared_ptr<data::ByteCorpus> corpus;   // lm
  std::shared_ptr<data::ByteCorpus> heldOut;  // lm with --test-data: the held-out file, whole
  std::shared_ptr<const data::Dataset> train, validation;
  Recipe recipe;
  int64_t totalSteps = 0;
};

RunData loadRunData(TrainConfig& config, observe::Logger& logger) {
  RunData run;
  if (config.model == "lm") {
    // lm without --optimizer and --lr: AdamW at 2e-3, warm-up over a tenth of the run, then
    // cosine decay.
    const std::string path = config.data.path == data::kFashionMnistDir ? kDefaultText : config.data.path;
    // One file: its last tenth is held out. With --test-data (nanoGPT's train.bin and val.bin),
    // all of --data trains and the held-out loss is the other file's.
    const double heldOutFraction = config.data.testPath.empty() ? 0.1 : 0.0;
    auto open = [&config, heldOutFraction](const std::string& file, int64_t vocab) {
      if (config.tokenType.empty()) {
        KOLO_REQUIRE(config.vocab == 0 || config.vocab == 256, "--vocab ", config.vocab,
                     ": a text's bytes have a vocabulary of 256 (token files: --token-dtype u16 or u32)");
        return std::make_shared<data::ByteCorpus>(file, config.seqLen, heldOutFraction);
      }
      const data::TokenType type = config.tokenType == "u8"    ? data::TokenType::U8
                                   : config.tokenType == "u16" ? data::TokenType::U16
                                                               : data::TokenType::U32;
      return std::make_shared<data::ByteCorpus>(file, data::TokenFileOptions{.type = type, .vocab = vocab},
                                                config.seqLen, heldOutFraction);
    };
    run.corpus = open(path, config.vocab);
    if (!config.data.testPath.empty()) {
      run.heldOut = open(config.data.testPath, config.vocab);
      KOLO_REQUIRE(config.vocab > 0 || run.heldOut->vocab() <= run.corpus->vocab(), "--test-data ", config.data.testPath,
                   " holds token ", run.heldOut->vocab() - 1, ", beyond --data's largest (", run.corpus->vocab() - 1,
                   "): give the vocabulary with --vocab");
    }
    config.vocab = run.corpus->vocab();
    run.train = std::make_shared<data::ByteWindows>(run.corpus);
    run.totalSteps = config.steps > 0 ? config.steps : kDefaultLmSteps;
    if (!config.optimizer && !config.lr) {
      config.optimizer = "adamw";
      config.lr = 2e-3;
      if (config.schedule == "auto") config.schedule = "warmup-cosine";
      if (!config.warmupSteps) config.warmupSteps = run.totalSteps / 10;
    }
    run.recipe = resolveRecipe(config, run.totalSteps);
    return run;
  }
  resolveRecipe(config, 1);  // the flags' values, before the (slow) data loading
  const data::TrainingData sets = loadDatasets(config, logger);
  run.train = sets.train;
  run.validation = sets.validation;
  const int64_t perEpoch = train::stepsPerEpoch(run.train->size(), config.batch, config.dropLast);
  run.recipe = resolveRecipe(config, perEpoch);
  run.totalSteps = run.recipe.epochs * perEpoch;
  if (config.steps > 0) run.totalSteps = config.epochs ? std::min(run.totalSteps, config.steps) : config.steps;
  return run;
}

// train::fit's options: the lm and model-parallel runs count steps (ten metrics intervals a
// run unless --metrics-every says otherwise), the images' data-parallel runs epochs.
train::FitOptions fitOptions(const TrainConfig& config, Family family, const RunData& run, observe::Logger& logger) {
  train::FitOptions options;
  setRunOptions(config, run.recipe, logger, options);
  options.describe.set("schedule", run.recipe.schedule.name);
  options.dropLast = config.dropLast;
  options.schedule = [&recipe = run.recipe](int64_t totalSteps, int64_t) {
    return optim::makeSchedule(recipe.schedule, totalSteps);
  };
  options.metricsEvery = config.metricsEvery;
  options.timingSkip = config.timingSkip;
  options.accumulate = config.accumulate;
  if (config.model == "lm" || family == Family::ModelParallel) {
    options.epochs = 0;
    options.steps = run.totalSteps;
    options.prefetch = config.prefetch == "on" ? 2 : 0;
    if (!config.givenFlags.count("--metrics-every")) options.metricsEvery = std::max<int64_t>(1, run.totalSteps / 10);
    options.timingSkip = std::min<int64_t>(config.timingSkip, run.totalSteps / 4);
  } else if (family == Family::DataParallel) {
    options.prefetch = onOrSpareCore(config.prefetch, config) ? 2 : 0;
  } else {
    options.prefetch = 0;  // elastic
  }
  if (family == Family::DataParallel) options.checkSyncEvery = config.checkSync;
  return options;
}

// The job: none for one process (one device, mirrored or central storage, a lone stage),
// else parallel::init() of the size the layout needs.
std::shared_ptr<comm::Communicator> joinJob(const TrainConfig& config, const parallel::MeshShape& shape) {
  const bool job = config.strategy == "fsdp" || config.strategy == "multi-worker-mirrored";
  if (config.mesh.empty() && shape.size() == 1 && !job) return nullptr;
  std::shared_ptr<comm::Communicator> world = parallel::init();
  if (!config.mesh.empty() || job) return world;  // the engine names --mesh and the sizes
  if (config.strategy == "tensor") {
    KOLO_REQUIRE(world->size() == config.tp, "--tp ", config.tp, " needs ", config.tp,
                 " ranks, this job has ", world->size(), ": run it under kolo run -n ", config.tp);
  } else {
    KOLO_REQUIRE(world->size() == config.stages, "--stages ", config.stages, " needs ", config.stages,
                 " ranks (one per stage), this job has ", world->size(), ": run it under kolo run -n ",
                 config.stages);
  }
  return world;
}

Tensor languageModelLoss(const Tensor& out, const Tensor& y) { return nn::languageModelLoss(out, y); }

std::unique_ptr<train::Engine> makeModelParallelEngine(const TrainConfig& config, const RunData& run,
                                                       const parallel::MeshShape& shape,
                                                       parallel::OptimizerFactory optimizers) {
  train::ModelParallelOptions options;
  options.communicator = joinJob(config, shape);
  options.mesh = shape;
  options.microBatches = config.microBatches;
  options.schedule = parallel::parsePipelineSchedule(config.pipelineSchedule);
  // One stage (one device, or data parallel only): recomputation per block, whose peak is one
  // block's activations; across stages the engine recomputes each stage per micro-batch.
  const bool perBlock = config.recompute && shape.pp == 1 && shape.tp == 1;
  options.recompute = config.recompute && !perBlock;
  options.sequenceParallel = config.sequenceParallel;
  if (config.shardReplicas)
    options.fsdp = parallel::FsdpOptions{.shard = parallel::parseShardLevel(config.shard),
                                         .shardGroup = config.hsdp ? parallel::kShardGroupPerHost : config.shardGroup,
                                         .clipNorm = config.clipNorm,
                                         .unitMinParameters = config.unitParams};
  if (!config.splitAt.empty()) {
    options.splitAt = parallel::parseSplitPoints(config.splitAt);
    if (config.model == "lm")
      options.modelPart = [&config](int begin, int end) { return buildModel(config, begin, end); };
    // The llama lm's head is its embedding's table: copies on the first and last stages.
    if (config.model == "lm" && config.arch == "llama")
      options.tiedParameters = {{"0.weight", std::to_string(config.layers + 2) + ".weight"}};
  } else if (shape.pp > 1) {
    // The layers are measured on one micro-batch of the training set's first samples.
    const int64_t rows = config.batch / shape.dp / config.microBatches;
    std::vector<int64_t> first(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) first[static_cast<size_t>(i)] = i;
    options.splitSample = run.train->gather(first).inputs;
  }
  if (config.model == "lm" && shape.tp == 1) options.loss = languageModelLoss;
  auto model = [&config, perBlock] {
    std::shared_ptr<nn::Sequential> built = buildModel(config);
    built->setRecompute(perBlock);
    return built;
  };
  return std::make_unique<train::ModelParallelEngine>(model, std::move(optimizers), options);
}

// engineOptions and what only a job that is not elastic reads: the reducer's overlap and
// sharded update (the elastic engine keeps both off), fsdp's shard level, group and units,
// clipping and --compress's hook.
train::DataParallelOptions dataParallelOptions(const TrainConfig& config, std::shared_ptr<comm::Communicator> comm) {
  train::DataParallelOptions options = engineOptions(config, comm);
  parallel::ReducerOptions& reducer = options.strategy.reducer;
  reducer.overlap = onOrSpareCore(config.overlap, config);
  reducer.shardOptimizer = config.shardOptimizer == "on" ||
                           (config.shardOptimizer == "auto" && config.algorithm == "auto" && !reducer.overlap);
  options.strategy.shard = parallel::parseShardLevel(config.shard);
  if (options.strategy.kind == parallel::StrategyKind::FullyShardedDataParallel) {
    KOLO_REQUIRE(!config.hsdp || config.shardGroup == 0, "--hsdp sets the shard group to the ranks of one host; "
                 "give it or --shard-group ", config.shardGroup, ", not both");
    options.strategy.shardGroup = config.hsdp ? parallel::kShardGroupPerHost : config.shardGroup;
    options.strategy.unitMinParameters = config.unitParams;
  }
  options.clipNorm = config.clipNorm;
  options.commHook =
      parallel::compression::makeCommHook(parallel::compression::parseCompressSpec(config.compress));
  if (options.commHook) reducer.shardOptimizer = false;
  return options;
}

// Under kolo run --elastic: this rank's engine over the members (engineOptions'
// multi-worker-mirrored), or null for a rank started in a lost one's place that the job
// finished without.
std::unique_ptr<train::Engine> makeElasticEngine(const TrainConfig& config, parallel::OptimizerFactory optimizers,
                                                 observe::Logger& logger) {
  parallel::ElasticOptions membership;
  membership.onAgreed = train::killInRegroup(config.faults, static_cast<int>(settings::rank().value_or(-1)));
  std::shared_ptr<parallel::ElasticContext> context = parallel::ElasticContext::fromEnvironment(membership);
  if (!context) {
    logger.info("elastic: the job finished before this rank was admitted", {{"rank", *settings::rank()}});
    return nullptr;
  }
  train::ElasticEngineOptions options;
  options.dataParallel = engineOptions(config, context->communicator());
  options.logger = &logger;
  if (!config.faults.kill.ranks.empty()) options.onRecovered = train::sinceKillField(context->store());
  return std::make_unique<train::ElasticEngine>(context, [&config] { return buildModel(config); },
                                                std::move(optimizers), options);
}

// The run's engine; null for a rank of an elastic job that finished without it.
std::unique_ptr<train::Engine> makeEngine(const TrainConfig& config, Family family, const parallel::MeshShape& shape,
                                          const RunData& run, observe::Logger& logger) {
  auto optimizers = [&recipe = run.recipe](const parallel::NamedTensors& p) {
    return optim::makeOptimizer(recipe.optimizer, p);
  };
  if (family == Family::Elastic) return makeElasticEngine(config, optimizers, logger);
  if (family == Family::ModelParallel) return makeModelParallelEngine(config, run, shape, optimizers);
  train::DataParallelOptions options = dataParallelOptions(config, joinJob(config, shape));
  if (config.model == "lm")
    options.loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return languageModelLoss(m.forward(x), y); };
  return std::make_unique<train::DataParallelEngine>([&config] { return buildModel(config); }, optimizers, options);
}

// Rank 0, after the run: the lm's line and a sample of generated text from the start of the
// held-out part, text the model did not train on.
void printLanguageModelSummary(const TrainConfig& config, const RunData& run, nn::Module& whole,
                               const train::FitSummary& summary, double heldOutLoss) {
  std::printf("train_loss %.4f held_out_loss %.4f steps %lld wall_s %.1f\n", summary.trainLoss, heldOutLoss,
              static_cast<long long>(summary.steps), summary.wallSeconds);
  if (run.corpus->vocab() != 256) return;  // tokens that are not bytes: no text to show
  Generator gen(config.seed + 1);
  const data::ByteCorpus& corpus = run.heldOut ? *run.heldOut : *run.corpus;
  const std::string prompt = corpus.text(run.heldOut ? 0 : corpus.trainBytes(), std::min<int64_t>(32, config.seqLen));
  const std::string text = nn::generateText(whole, prompt, config.sampleBytes, config.seqLen, 0.8, gen);
  std::string shown;
  for (char c : text) shown.push_back((c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? c : '?');
  std::printf("sample:\n%s\n", shown.c_str());
}

// Rank 0, after the run: the per-rank report of model-parallel and lm runs, then the
// summary line of the family (with the lm's sample).
void printReport(const TrainConfig& config, Family family, const RunData& run, train::Engine& engine,
                 const train::FitSummary& summary, double heldOutLoss) {
  const bool lm = config.model == "lm";
  if (lm || family == Family::ModelParallel) {
    const train::RankReport report = train::rankReport(engine, summary);
    for (const std::string& line : report.ranks)
      if (!config.quiet) std::fprintf(stderr, "%s\n", line.c_str());
    std::printf("%s\n", report.layout.c_str());
  }
  if (lm) {
    printLanguageModelSummary(config, run, engine.model(), summary, heldOutLoss);
  } else if (family == Family::Elastic) {
    const parallel::ElasticContext& context = engine.elastic()->context();
    std::printf("test_accuracy %.4f train_loss %.4f steps %lld world_size %d generation %lld wall_s %.1f\n",
                summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps), context.size(),
                static_cast<long long>(context.generation()), summary.wallSeconds);
  } else if (family == Family::ModelParallel) {
    std::printf("test_accuracy %.4f train_loss %.4f steps %lld wall_s %.1f\n", summary.validationAccuracy,
                summary.trainLoss, static_cast<long long>(summary.steps), summary.wallSeconds);
  } else {
    if (!config.quiet)
      std::fprintf(stderr, "trained %s for %lld steps on %d replica(s): test accuracy %.2f%%\n", config.model.c_str(),
                   static_cast<long long>(summary.steps), engine.replicas(), 100.0 * summary.validationAccuracy);
    std::printf(
        "test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f steady_samples_per_s %.1f wall_s %.1f "
        "grad_bytes_per_step %.0f\n",
        summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
        summary.samplesPerSecond, summary.steadySamplesPerSecond, summary.wallSeconds, summary.gradBytesPerStep);
  }
  std::fflush(stdout);
}

}  // namespace

train::DataParallelOptions engineOptions(const TrainConfig& config, std::shared_ptr<comm::Communicator> comm) {
  train::DataParallelOptions options;
  options.strategy =
      parallel::strategyOptionsFromNames(config.strategy, config.replicas, config.reduction, config.algorithm, comm);
  options.strategy.reducer.bucketCapBytes = static_cast<size_t>(config.bucketMb * (1 << 20));
  options.strategy.reducer.firstBucketCapBytes = static_cast<size_t>(config.firstBucketMb * (1 << 20));
  options.recompute = config.recompute;
  options.strategy.syncBatchNorm = config.syncBatchNorm;
  if (config.balance) {
    options.balanceBatch = config.batch;
    options.balancer.replanEvery = config.balanceEvery;
  }
  return options;
}

int runTraining(const TrainConfig& flags, observe::Logger& logger) {
  TrainConfig config = flags;
  const Family family = familyOf(config);
  const parallel::MeshShape shape = checkFlags(config, family);
  setNumThreads(config.threads);
  const RunData run = loadRunData(config, logger);
  // The engine outlives the options and callbacks, whose anomaly detector hooks its model.
  const std::unique_ptr<train::Engine> engine = makeEngine(config, family, shape, run, logger);
  if (!engine) return 0;  // a joiner the elastic job finished without
  train::FitOptions options = fitOptions(config, family, run, logger);
  if (!config.initPath.empty() && engine->isPrimary()) logger.info("loaded initial weights", {{"file", config.initPath}});
  train::FitCallbacks callbacks;
  if (family == Family::Elastic) {
    options.describe.set("min_ranks", engine->elastic()->context().minRanks());
    callbacks = train::injectElasticFaults(config.faults, *engine->elastic());
  } else {
    if (family == Family::ModelParallel) options.describe.set("mesh", config.mesh);
    // --detect-anomaly, and --debug-nan-at whose NaN it must name (not under central storage:
    // train_flags.cc).
    if (config.detectAnomaly || config.faults.nan.step >= 0) {
      // Parameter gradients are read as they become final, not while a reducer all-reduces
      // buckets in place during backward.
      options.anomalyDetector = std::make_shared<observe::AnomalyDetector>(
          engine->model(), observe::AnomalyOptions{.parameterGradients = config.strategy == "one-device",
                                                   .rank = engine->rank()});
    }
    callbacks = train::injectFaults(config.faults, engine->rank(), {}, &engine->model(), options.anomalyDetector.get());
  }
  // At the end, on every rank: the lm's held-out figures (the metrics' final line); the whole
  // model for --save and the sample (their memory is not the training's budget).
  double heldOutLoss = 0.0;
  callbacks.onEnd = [&](const train::FitSummary&) {
    observe::Fields fields;
    if (config.model == "lm") {
      const train::EvaluateResult heldOut =
          engine->evaluate(run.heldOut ? data::ByteWindows(run.heldOut, false) : data::ByteWindows(run.corpus, true),
                           {.batch = config.batch, .loss = nn::languageModelLoss});
      heldOutLoss = heldOut.loss;
      fields = {{"held_out_loss", heldOut.loss}, {"held_out_accuracy", heldOut.accuracy}};
    }
    if (config.model == "lm" || !config.savePath.empty()) {
      setTensorMemoryLimit(0);
      engine->gatherModel();
    }
    return fields;
  };

  const train::FitSummary summary = train::fit(*engine, run.train, run.validation, options, callbacks);
  if (!engine->isPrimary()) return 0;
  saveWeights(config, engine->model(), summary.steps, logger);
  printReport(config, family, run, *engine, summary, heldOutLoss);
  return 0;
}

}  // namespace kolo::cli
