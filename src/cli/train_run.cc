// `kolo train` with every strategy but parameter servers and federated learning: the flags
// mapped onto one train::Engine and train::fit. train::DataParallelEngine for one-device,
// mirrored, central-storage, multi-worker-mirrored and fsdp; train::ModelParallelEngine for
// pipeline, tensor, --mesh and the lm on one device; train::ElasticEngine under kolo run
// --elastic. The loop is the library's; what stays here is the command line's own: the
// built-in models and data, the faults of the test flags, the per-rank report, the lm's
// held-out loss and text sample, --save and the summary line.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "cli/train_loop.h"
#include "kolo/byte_corpus.h"
#include "kolo/comm/init.h"
#include "kolo/memory.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/compression.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/elastic.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/safetensors.h"
#include "kolo/threads.h"
#include "kolo/train/elastic.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"

namespace kolo::cli {
namespace {

using parallel::StrategyKind;

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

// The compute threads of one rank: its replicas' (mirrored, central-storage) times --threads.
int localThreads(const TrainConfig& config) {
  const bool inProcess = config.strategy == "mirrored" || config.strategy == "central-storage";
  return (inProcess ? config.replicas : 1) * config.threads;
}

std::vector<int> parseSplits(const std::string& text) {
  std::vector<int> splits;
  std::stringstream in(text);
  std::string word;
  while (std::getline(in, word, ',')) {
    try {
      size_t used = 0;
      splits.push_back(std::stoi(word, &used));
      if (used != word.size()) throw std::invalid_argument(word);
    } catch (const std::exception&) {
      KOLO_THROW(InvalidArgument, "--split-at '", text, "' is not accepted: use layer indices such as 3,6");
    }
  }
  return splits;
}

int64_t layerCount(const TrainConfig& config) {
  if (config.model == "lm") return config.layers + 3;
  Generator gen(0);
  return static_cast<int64_t>(nn::makeModel(config.model, gen)->size());
}

// The seeded model, or for lm only its layers [begin, end) (end < 0: to the last) with
// placeholders for the others, so that a stage never holds the whole model; --init fills
// what it holds.
std::shared_ptr<nn::Sequential> buildModel(const TrainConfig& config, int begin = 0, int end = -1) {
  Generator gen(config.seed);
  const bool part = config.model == "lm" && (begin > 0 || end >= 0);
  std::shared_ptr<nn::Sequential> model;
  if (config.model == "lm") {
    const nn::LanguageModelConfig sizes{.vocab = 256, .layers = config.layers, .dModel = config.dModel,
                                        .heads = config.heads, .seqLen = config.seqLen};
    model = part ? nn::makeLanguageModelPart(sizes, gen, begin, end < 0 ? layerCount(config) : end)
                 : nn::makeLanguageModel(sizes, gen);
  } else {
    model = nn::makeModel(config.model, gen);
  }
  if (config.initPath.empty()) return model;
  if (!part) {
    loadInitialWeights(config.initPath, *model);
    return model;
  }
  std::vector<std::pair<std::string, Tensor>> mine;
  std::set<std::string> names;
  for (const auto& entry : model->stateDict()) names.insert(entry.first);
  for (auto& entry : checkpoint::loadSafetensors(config.initPath).tensors)
    if (names.count(entry.first)) mine.push_back(std::move(entry));
  model->loadStateDict(mine, config.initPath);
  return model;
}

// The run's data and length: the lm's text windows (the held-out loss is computed at the end)
// or Fashion-MNIST with its test split.
struct RunData {
  std::shared_ptr<data::ByteCorpus> corpus;  // lm
  std::shared_ptr<const data::Dataset> train, validation;
  Recipe recipe;
  int64_t totalSteps = 0;
};

RunData loadRunData(TrainConfig& config) {
  RunData run;
  if (config.model == "lm") {
    // lm without --optimizer and --lr: AdamW at 2e-3, warm-up over a tenth of the run, then
    // cosine decay.
    const std::string path = config.dataDir == data::kFashionMnistDir ? kDefaultText : config.dataDir;
    run.corpus = std::make_shared<data::ByteCorpus>(path, config.seqLen);
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
  std::shared_ptr<data::TensorDataset> images = loadTrainingSet(config);
  run.train = images;
  run.validation = std::make_shared<data::FashionMnist>(config.dataDir, false);
  const int64_t perEpoch = train::stepsPerEpoch(images->size(), config.batch, config.dropLast);
  run.recipe = resolveRecipe(config, perEpoch);
  run.totalSteps = run.recipe.epochs * perEpoch;
  if (config.steps > 0) run.totalSteps = config.epochs ? std::min(run.totalSteps, config.steps) : config.steps;
  return run;
}

// The flags of the lm and the model-parallel strategies; returns the mesh they set up
// (--mesh, or --stages, or --tp), with config.strategy set to what --mesh implies.
parallel::MeshShape checkModelParallelFlags(TrainConfig& config) {
  parallel::MeshShape shape;
  if (!config.mesh.empty()) {
    // --mesh dp=D,pp=P,tp=T sets the strategy and its sizes: pipeline stages (split over
    // tensor groups when tp > 1), or tensor parallelism alone when pp = 1.
    shape = parallel::parseMeshShape(config.mesh);
    KOLO_REQUIRE(config.stages == 1 && config.tp == 1, "--mesh sets the stages and --tp; give one or the other");
    config.strategy = shape.pp == 1 && shape.tp > 1 ? "tensor" : "pipeline";
    config.stages = shape.pp;
    config.tp = shape.tp;
  }
  const bool lm = config.model == "lm";
  const bool pipeline = config.strategy == "pipeline";
  const bool tensor = config.strategy == "tensor";
  const bool replicated = familyOf(config) == Family::DataParallel;
  KOLO_REQUIRE(pipeline || tensor || replicated || config.strategy == "one-device", "--model lm trains with "
               "--strategy one-device, mirrored, central-storage, multi-worker-mirrored, fsdp, pipeline or "
               "tensor, not ", config.strategy);
  KOLO_REQUIRE(config.tp >= 1, "--tp must be at least 1, got ", config.tp);
  KOLO_REQUIRE(
      tensor || config.tp == 1 || !config.mesh.empty(), "--tp ", config.tp,
      " needs --strategy tensor (pipeline stages split over tensor groups: --mesh dp=1,pp=P,tp=T)");
  KOLO_REQUIRE(!(tensor || replicated) || (config.microBatches == 1 && config.stages == 1 && config.splitAt.empty()),
               "--strategy ", config.strategy, " takes no --stages, --micro-batches or --split-at");
  KOLO_REQUIRE(!tensor || !config.recompute, "--strategy tensor takes no --recompute");
  KOLO_REQUIRE(tensor || config.tp > 1 || !config.sequenceParallel,
               "--sequence-parallel needs --strategy tensor (or a mesh with tp)");
  KOLO_REQUIRE(lm || !config.sequenceParallel, "--sequence-parallel works with --model lm only");
  KOLO_REQUIRE(config.checkpointEvery >= 0, "--checkpoint-every must be at least 0, got ",
               config.checkpointEvery);
  KOLO_REQUIRE(config.clipNorm == 0.0 || config.strategy == "fsdp", "--clip-norm is not available with --model lm "
               "or --strategy pipeline or tensor, except under --strategy fsdp");
  KOLO_REQUIRE(config.stages >= 1 && config.microBatches >= 1, "--stages and --micro-batches must be at least 1");
  KOLO_REQUIRE(pipeline || config.stages == 1, "--stages ", config.stages, " needs --strategy pipeline");
  parallel::parsePipelineSchedule(config.pipelineSchedule);
  if (lm && !config.batchGiven) config.batch = kDefaultLmBatch;
  KOLO_REQUIRE(config.batch % (shape.dp * config.microBatches) == 0, "--batch ", config.batch,
               " cannot be split into ", shape.dp * config.microBatches, " equal micro-batches (",
               shape.dp, " replica(s) x ", config.microBatches, "): use a multiple of --micro-batches",
               shape.dp > 1 ? " times the mesh's dp" : "");
  if (config.mesh.empty()) shape = {.dp = 1, .pp = config.stages, .tp = config.tp};
  return shape;
}

// The flags of the elastic runs: multi-worker-mirrored without what one generation's
// replicas could not share.
void checkElasticFlags(const TrainConfig& config) {
  KOLO_REQUIRE(config.strategy == "multi-worker-mirrored",
               "kolo run --elastic trains with --strategy multi-worker-mirrored, not --strategy ",
               config.strategy);
  KOLO_REQUIRE(config.initPath.empty() && config.clipNorm == 0.0 && !config.detectAnomaly && config.checkSync == 0,
               "--init, --clip-norm, --detect-anomaly and --check-sync are not available under kolo run --elastic");
  KOLO_REQUIRE(config.threads >= 1, "--threads must be at least 1, got ", config.threads);
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

std::unique_ptr<train::ModelParallelEngine> makeModelParallelEngine(const TrainConfig& config, const RunData& run,
                                                   const parallel::MeshShape& shape,
                                                   std::shared_ptr<comm::Communicator> world) {
  train::ModelParallelOptions options;
  options.communicator = std::move(world);
  options.mesh = shape;
  options.microBatches = config.microBatches;
  options.schedule = parallel::parsePipelineSchedule(config.pipelineSchedule);
  // One stage (one device, or data parallel only): recomputation per block, whose peak is one
  // block's activations; across stages the engine recomputes each stage per micro-batch.
  const bool perBlock = config.recompute && shape.pp == 1 && shape.tp == 1;
  options.recompute = config.recompute && !perBlock;
  options.sequenceParallel = config.sequenceParallel;
  if (!config.splitAt.empty()) {
    options.splitAt = parseSplits(config.splitAt);
    if (config.model == "lm")
      options.modelPart = [&config](int begin, int end) { return buildModel(config, begin, end); };
  } else if (shape.pp > 1) {
    // The layers are measured on one micro-batch of the training set's first samples.
    const int64_t rows = config.batch / shape.dp / config.microBatches;
    std::vector<int64_t> first(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) first[static_cast<size_t>(i)] = i;
    options.splitSample = run.train->gather(first).inputs;
  }
  if (config.model == "lm" && shape.tp == 1) options.loss = languageModelLoss;
  return std::make_unique<train::ModelParallelEngine>(
      [&config, perBlock] {
        std::shared_ptr<nn::Sequential> model = buildModel(config);
        model->setRecompute(perBlock);
        return model;
      },
      [recipe = run.recipe](const parallel::NamedTensors& p) { return makeOptimizer(recipe, p); }, options);
}

// Who a rank of the report is and which layers it holds.
struct RankPlace {
  std::string who;  // "stage 1", "rank 0", "stage 1 rank 0"
  int first = 0, last = 0;
};

// Rank 0: one line per rank of `ranks` (unless --quiet); returns the slowest rank's compute
// and the longest step, per step.
std::pair<double, double> printRankFigures(const TrainConfig& config, const std::vector<train::RankFigures>& ranks,
                                           const std::function<RankPlace(size_t rank)>& place) {
  double slowest = 0.0, stepTime = 0.0;
  constexpr double kMiB = 1 << 20;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const train::RankFigures& f = ranks[r];
    slowest = std::max(slowest, f.computeSeconds);
    stepTime = std::max(stepTime, f.stepSeconds);
    const RankPlace at = place(r);
    if (!config.quiet)
      std::fprintf(stderr,
                   "%s: layers %d-%d  compute %.1f ms/step  step %.1f ms  peak micro-batches held %lld  "
                   "peak boundary activations %.2f MiB  peak step memory %.2f MiB  peak tensors %.2f MiB  "
                   "peak rss %.1f MiB\n",
                   at.who.c_str(), at.first, at.last, 1000.0 * f.computeSeconds, 1000.0 * f.stepSeconds,
                   static_cast<long long>(f.peakMicroBatchesHeld), f.peakBoundaryBytes / kMiB,
                   f.peakStepBytes / kMiB, f.peakTensorBytes / kMiB, f.peakResidentBytes / kMiB);
  }
  return {slowest, stepTime};
}

// Rank 0: each rank of replica 0's model group (stage s, tensor rank t: world rank s·tp + t;
// the other replicas hold the same) against the schedule's ideal (the slowest stage's compute
// times (M + P − 1) / M).
void printStageReport(const TrainConfig& config, const train::ModelParallelEngine& engine,
                      std::vector<train::RankFigures> ranks) {
  const parallel::MeshShape& shape = engine.mesh();
  const std::vector<int>& bounds = engine.bounds();
  const bool tensorOnly = shape.pp == 1 && shape.tp > 1;
  const auto tp = static_cast<size_t>(shape.tp);
  ranks.resize(static_cast<size_t>(shape.pp * shape.tp));
  const auto [slowest, stepTime] = printRankFigures(config, ranks, [&](size_t r) {
    const size_t s = tensorOnly ? 0 : r / tp;
    std::string who = tensorOnly ? "rank " + std::to_string(r) : "stage " + std::to_string(s);
    if (tp > 1 && !tensorOnly) who += " rank " + std::to_string(r % tp);
    return RankPlace{who, bounds[s], bounds[s + 1] - 1};
  });
  if (tensorOnly) {
    std::printf("tensor_parallel ranks %zu step_ms %.2f\n", ranks.size(), 1000.0 * stepTime);
    return;
  }
  const int m = config.microBatches, stages = shape.pp;
  const double ideal = slowest * (m + stages - 1) / m;
  std::printf("pipeline stages %d micro_batches %d schedule %s step_ms %.2f ideal_ms %.2f measured_over_ideal %.3f\n",
              stages, m, config.pipelineSchedule.c_str(), 1000.0 * stepTime, 1000.0 * ideal,
              ideal > 0 ? stepTime / ideal : 0.0);
}

// Rank 0, after the run: the lm's line and a sample of generated text from the start of the
// held-out part, text the model did not train on.
void printLanguageModelSummary(const TrainConfig& config, const RunData& run, nn::Module& whole,
                               const train::FitSummary& summary, double heldOutLoss) {
  std::printf("train_loss %.4f held_out_loss %.4f steps %lld wall_s %.1f\n", summary.trainLoss, heldOutLoss,
              static_cast<long long>(summary.steps), summary.wallSeconds);
  Generator gen(config.seed + 1);
  const data::ByteCorpus& corpus = *run.corpus;
  const std::string prompt = corpus.text(corpus.trainBytes(), std::min<int64_t>(32, config.seqLen));
  const std::string text = nn::generateText(whole, prompt, config.sampleBytes, config.seqLen, 0.8, gen);
  std::string shown;
  for (char c : text) shown.push_back((c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? c : '?');
  std::printf("sample:\n%s\n", shown.c_str());
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

train::DataParallelOptions engineOptions(const TrainConfig& config, std::shared_ptr<comm::Communicator> comm) {
  train::DataParallelOptions options;
  options.strategy =
      parallel::strategyOptionsFromNames(config.strategy, config.replicas, config.reduction, config.algorithm, comm);
  parallel::ReducerOptions& reducer = options.strategy.reducer;
  reducer.bucketCapBytes = static_cast<size_t>(config.bucketMb * (1 << 20));
  reducer.firstBucketCapBytes = static_cast<size_t>(config.firstBucketMb * (1 << 20));
  reducer.overlap = onOrSpareCore(config.overlap, localThreads(config));
  reducer.shardOptimizer =
      config.shardOptimizer == "on" ||
      (config.shardOptimizer == "auto" && config.algorithm == "auto" && !reducer.overlap);
  options.strategy.shard = parallel::parseShardLevel(config.shard);
  options.recompute = config.recompute;
  if (options.strategy.kind == StrategyKind::FullyShardedDataParallel) {
    options.strategy.shardGroup = shardGroupSize(config, comm->size());
    options.strategy.unitMinParameters = config.unitParams;
  }
  options.clipNorm = config.clipNorm;
  options.commHook =
      parallel::compression::makeCommHook(parallel::compression::parseCompressSpec(config.compress));
  if (options.commHook) reducer.shardOptimizer = false;
  if (config.balance) {
    options.balanceBatch = config.batch;
    options.balancer.replanEvery = config.balanceEvery;
  }
  return options;
}

int runTraining(const TrainConfig& configIn, observe::Logger& logger) {
  TrainConfig config = configIn;
  const Family family = familyOf(config);
  const bool lm = config.model == "lm";
  parallel::MeshShape shape;
  if (family == Family::Elastic) checkElasticFlags(config);
  if (lm || family == Family::ModelParallel) shape = checkModelParallelFlags(config);
  if (family == Family::DataParallel) checkDataParallelFlags(config);
  setNumThreads(config.threads);
  const RunData run = loadRunData(config);
  const Recipe& recipe = run.recipe;
  auto optimizers = [&recipe](const parallel::NamedTensors& p) { return makeOptimizer(recipe, p); };

  // The engine outlives the options and callbacks, whose anomaly detector hooks its model.
  std::unique_ptr<train::Engine> engine;
  std::shared_ptr<comm::Communicator> world;  // the job of a run that is not elastic

  // train::fit's options: the lm and model-parallel runs count steps (ten metrics intervals
  // a run unless --metrics-every says otherwise), the images' data-parallel runs epochs.
  train::FitOptions options = fitOptions(config, recipe, logger);
  if (lm || family == Family::ModelParallel) {
    options.epochs = 0;
    options.steps = run.totalSteps;
    options.prefetch = config.prefetch == "on" ? 2 : 0;
    options.metricsEvery = config.givenFlags.count("--metrics-every") ? config.metricsEvery
                                                                       : std::max<int64_t>(1, run.totalSteps / 10);
    options.timingSkip = std::min<int64_t>(config.timingSkip, run.totalSteps / 4);
  } else if (family == Family::DataParallel) {
    options.prefetch = onOrSpareCore(config.prefetch, localThreads(config)) ? 2 : 0;
  }
  if (family == Family::DataParallel) options.checkSyncEvery = config.checkSync;

  train::FitCallbacks callbacks;
  if (family == Family::Elastic) {
    std::unique_ptr<train::ElasticEngine> elastic = makeElasticEngine(
        config, [&config] { return buildModel(config); }, optimizers, logger);
    if (!elastic) return 0;  // a joiner the job finished without
    options.prefetch = 0;
    options.describe.set("min_ranks", elastic->context().minRanks());
    callbacks = elasticHooks(config, *elastic);
    engine = std::move(elastic);
  } else if (family == Family::ModelParallel) {
    world = joinJob(config, shape);
    engine = makeModelParallelEngine(config, run, shape, world);
    options.describe.update({{"mesh", config.mesh}});
  } else {
    world = joinJob(config, shape);
    train::DataParallelOptions dataParallel = engineOptions(config, world);
    if (lm)
      dataParallel.loss = [](nn::Module& m, const Tensor& x, const Tensor& y) {
        return languageModelLoss(m.forward(x), y);
      };
    engine = std::make_unique<train::DataParallelEngine>([&config] { return buildModel(config); }, optimizers,
                                                         dataParallel);
  }
  if (!config.initPath.empty() && engine->isPrimary()) logger.info("loaded initial weights", {{"file", config.initPath}});
  if (family != Family::Elastic) {
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
    if (lm) {
      const train::EvaluateResult heldOut =
          engine->evaluate(data::ByteWindows(run.corpus, true), {.batch = config.batch, .loss = nn::languageModelLoss});
      heldOutLoss = heldOut.loss;
      fields = {{"held_out_loss", heldOut.loss}, {"held_out_accuracy", heldOut.accuracy}};
    }
    if (lm || !config.savePath.empty()) {
      setTensorMemoryLimit(0);
      engine->gatherModel();
    }
    return fields;
  };

  const train::FitSummary summary = train::fit(*engine, run.train, run.validation, options, callbacks);
  if (!engine->isPrimary()) return 0;
  if (!config.savePath.empty()) {
    checkpoint::saveSafetensors(config.savePath, engine->model().stateDict(),
                                {{"format", "pt"}, {"model", config.model}, {"step", std::to_string(summary.steps)}});
    logger.info("saved weights", {{"file", config.savePath}});
  }
  if (auto* modelParallel = dynamic_cast<train::ModelParallelEngine*>(engine.get())) {
    printStageReport(config, *modelParallel, summary.ranks);
  } else if (lm) {
    const int layers = static_cast<int>(layerCount(config));
    const double stepTime = printRankFigures(config, summary.ranks, [&](size_t r) {
      return RankPlace{"rank " + std::to_string(r), 0, layers - 1};
    }).second;
    std::printf("%s ranks %d replicas %d step_ms %.2f\n", config.strategy.c_str(),
                world ? world->size() : 1, engine->replicas(), 1000.0 * stepTime);
  }
  if (lm) {
    printLanguageModelSummary(config, run, engine->model(), summary, heldOutLoss);
  } else if (family == Family::Elastic) {
    const parallel::ElasticContext& context = engine->elastic()->context();
    std::printf("test_accuracy %.4f train_loss %.4f steps %lld world_size %d generation %lld wall_s %.1f\n",
                summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps), context.size(),
                static_cast<long long>(context.generation()), summary.wallSeconds);
  } else if (family == Family::ModelParallel) {
    std::printf("test_accuracy %.4f train_loss %.4f steps %lld wall_s %.1f\n", summary.validationAccuracy,
                summary.trainLoss, static_cast<long long>(summary.steps), summary.wallSeconds);
  } else {
    if (!config.quiet)
      std::fprintf(stderr, "trained %s for %lld steps on %d replica(s): test accuracy %.2f%%\n", config.model.c_str(),
                   static_cast<long long>(summary.steps), engine->replicas(), 100.0 * summary.validationAccuracy);
    std::printf(
        "test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f steady_samples_per_s %.1f wall_s %.1f "
        "grad_bytes_per_step %.0f\n",
        summary.validationAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
        summary.samplesPerSecond, summary.steadySamplesPerSecond, summary.wallSeconds, summary.gradBytesPerStep);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace kolo::cli
