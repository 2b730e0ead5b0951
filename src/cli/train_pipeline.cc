// `kolo train --model lm`, `--strategy pipeline`, `--strategy tensor` and `--mesh`: the flags
// mapped onto a train::ModelParallelEngine (the model cut into stages, its layers split over
// tensor ranks, replicas of either) and onto train::fit; `--model lm` under the data-parallel
// strategies onto a train::DataParallelEngine. Batches come from a byte-level text file (lm, data::ByteWindows)
// or Fashion-MNIST (mlp, cnn). What stays here is the command line's own: the per-stage
// timings against the schedule's ideal and peak memory, the lm's held-out loss and text
// sample, and --save. The loop is the library's.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>

#include "cli/train_loop.h"
#include "kolo/byte_corpus.h"
#include "kolo/memory.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/safetensors.h"
#include "kolo/serialize.h"
#include "kolo/threads.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"

namespace kolo::cli {
namespace {

// The default text of `--model lm`: the GNU GPL version 3, which Debian's base-files package
// installs on every system.
constexpr const char* kDefaultText = "/usr/share/common-licenses/GPL-3";
constexpr int64_t kDefaultLmSteps = 300;
constexpr int64_t kDefaultLmBatch = 16;

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

// The model, or for lm only its layers [begin, end) (end < 0: to the last) with placeholders
// for the others, so that a stage never holds the whole model; --init fills what it holds.
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
    kolo::load(*model, config.initPath);
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

// The run's data and length: the lm's text windows (no validation set: the held-out loss is
// computed at the end) or Fashion-MNIST with its test split.
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
  std::shared_ptr<data::TensorDataset> images = loadTrainingSet(config);
  run.train = images;
  run.validation = std::make_shared<data::FashionMnist>(config.dataDir, false);
  const int64_t perEpoch = train::stepsPerEpoch(images->size(), config.batch, config.dropLast);
  run.recipe = resolveRecipe(config, perEpoch);
  run.totalSteps = run.recipe.epochs * perEpoch;
  if (config.steps > 0) run.totalSteps = config.epochs ? std::min(run.totalSteps, config.steps) : config.steps;
  return run;
}

// train::fit's options from the flags: the shared mapping, over the run's step count.
train::FitOptions fitOptions(const TrainConfig& config, const RunData& run, observe::Logger& logger) {
  train::FitOptions options = cli::fitOptions(config, run.recipe, logger);
  options.epochs = 0;
  options.steps = run.totalSteps;
  options.prefetch = config.prefetch == "on" ? 2 : 0;
  const Recipe recipe = run.recipe;  // the options outlive this call's arguments
  options.schedule = [recipe](int64_t totalSteps, int64_t) { return makeSchedule(recipe, totalSteps); };
  // Ten metrics intervals per run unless --metrics-every says otherwise.
  options.metricsEvery = config.givenFlags.count("--metrics-every")
                             ? config.metricsEvery
                             : std::max<int64_t>(1, run.totalSteps / 10);
  options.timingSkip = std::min<int64_t>(config.timingSkip, run.totalSteps / 4);
  return options;
}

// What a finished run reports beyond fit's figures: for lm the held-out loss and accuracy (the
// metrics' final line) and a text sample, for the images the test accuracy; and --save.
class RunReport {
 public:
  RunReport(const TrainConfig& config, const RunData& run) : config_(config), run_(run) {}
  // The lm's loss and next-byte accuracy over every window of the held-out last tenth of the
  // text (train::Engine::evaluate). Collective.
  observe::Fields heldOut(train::Engine& engine) {
    if (!run_.corpus) return {};
    const train::EvaluateResult figures = engine.evaluate(data::ByteWindows(run_.corpus, true),
                                                          {.batch = config_.batch, .loss = nn::languageModelLoss});
    heldOutLoss_ = figures.loss;
    return {{"held_out_loss", figures.loss}, {"held_out_accuracy", figures.accuracy}};
  }
  // Rank 0 after fit: the summary line, --save, and the lm's sample.
  void finish(nn::Module& whole, const train::FitSummary& summary, observe::Logger& logger) {
    if (!config_.savePath.empty()) {
      checkpoint::saveSafetensors(config_.savePath, whole.namedParameters(),
                                  {{"format", "pt"}, {"model", config_.model}, {"step", std::to_string(summary.steps)}});
      logger.info("saved weights", {{"file", config_.savePath}});
    }
    if (!run_.corpus) {
      std::printf("test_accuracy %.4f train_loss %.4f steps %lld wall_s %.1f\n", summary.validationAccuracy,
                  summary.trainLoss, static_cast<long long>(summary.steps), summary.wallSeconds);
      std::fflush(stdout);
      return;
    }
    std::printf("train_loss %.4f held_out_loss %.4f steps %lld wall_s %.1f\n", summary.trainLoss, heldOutLoss_,
                static_cast<long long>(summary.steps), summary.wallSeconds);
    Generator gen(config_.seed + 1);
    // The prompt: the start of the held-out part, text the model did not train on.
    const data::ByteCorpus& corpus = *run_.corpus;
    const std::string prompt = corpus.text(corpus.trainBytes(), std::min<int64_t>(32, config_.seqLen));
    const std::string text = nn::generateText(whole, prompt, config_.sampleBytes, config_.seqLen, 0.8, gen);
    std::string shown;
    for (char c : text) shown.push_back((c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? c : '?');
    std::printf("sample:\n%s\n", shown.c_str());
    std::fflush(stdout);
  }

 private:
  const TrainConfig& config_;
  const RunData& run_;
  double heldOutLoss_ = 0.0;
};

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

// Whether the lm trains as replicas (train::DataParallelEngine) rather than in stages.
bool dataParallel(const TrainConfig& config) {
  return config.mesh.empty() && (config.strategy == "mirrored" || config.strategy == "central-storage" ||
                                 config.strategy == "multi-worker-mirrored" || config.strategy == "fsdp");
}

// The flags of the model-parallel strategies; returns the mesh they set up (--mesh, or
// --stages, or --tp), with config.strategy set to what --mesh implies.
parallel::MeshShape checkFlags(TrainConfig& config) {
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
  const bool fsdp = config.strategy == "fsdp";
  const bool replicated = dataParallel(config);
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
  KOLO_REQUIRE(config.clipNorm == 0.0 || fsdp, "--clip-norm is not available with --model lm or "
               "--strategy pipeline or tensor, except under --strategy fsdp");
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

// The job: none for one process (a lone stage), else parallel::init() of the size the
// layout needs.
std::shared_ptr<comm::Communicator> joinJob(const TrainConfig& config, const parallel::MeshShape& shape) {
  const bool job = config.strategy == "fsdp" || config.strategy == "multi-worker-mirrored";
  if (config.mesh.empty() && shape.size() == 1 && !job) return nullptr;
  std::shared_ptr<comm::Communicator> world = parallel::init();
  if (!config.mesh.empty()) return world;  // the engine names --mesh and the sizes
  if (config.strategy == "tensor") {
    KOLO_REQUIRE(world->size() == config.tp, "--tp ", config.tp, " needs ", config.tp,
                 " ranks, this job has ", world->size(), ": run it under kolo run -n ", config.tp);
  } else if (!job) {
    KOLO_REQUIRE(world->size() == config.stages, "--stages ", config.stages, " needs ", config.stages,
                 " ranks (one per stage), this job has ", world->size(), ": run it under kolo run -n ",
                 config.stages);
  }
  return world;
}

Tensor languageModelLoss(const Tensor& out, const Tensor& y) { return nn::languageModelLoss(out, y); }

// `--model lm` under a data-parallel strategy (mirrored, central-storage,
// multi-worker-mirrored, fsdp): a train::DataParallelEngine over the flags' options, as for
// the images (train_data_parallel.cc); one-device runs as one stage (its micro-batches
// accumulate gradients). `world`: the job for multi-worker-mirrored and fsdp, else null.
int runLanguageModelDataParallel(const TrainConfig& config, const RunData& run,
                                 std::shared_ptr<comm::Communicator> world, observe::Logger& logger) {
  checkDataParallelFlags(config);
  train::DataParallelOptions options = engineOptions(config, world);
  options.loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return languageModelLoss(m.forward(x), y); };
  const Recipe recipe = run.recipe;
  train::DataParallelEngine engine([&config] { return buildModel(config); },
                                   [recipe](const parallel::NamedTensors& p) { return makeOptimizer(recipe, p); },
                                   options);
  RunReport report(config, run);
  train::FitCallbacks callbacks = train::injectFaults(config.faults, engine.rank());
  callbacks.onEnd = [&](const train::FitSummary&) {
    observe::Fields heldOut = report.heldOut(engine);
    // --save and the sample take the whole model on rank 0: the budget covers training.
    setTensorMemoryLimit(0);
    engine.gatherModel();
    return heldOut;
  };
  train::FitOptions fitOptionsHere = fitOptions(config, run, logger);
  fitOptionsHere.checkSyncEvery = config.checkSync;
  const train::FitSummary summary = train::fit(engine, run.train, run.validation, fitOptionsHere, callbacks);
  if (!engine.isPrimary()) return 0;
  const int layers = static_cast<int>(layerCount(config));
  const double stepTime = printRankFigures(config, summary.ranks, [&](size_t r) {
    return RankPlace{"rank " + std::to_string(r), 0, layers - 1};
  }).second;
  std::printf("%s ranks %d replicas %d step_ms %.2f\n", config.strategy.c_str(), world ? world->size() : 1,
              engine.replicas(), 1000.0 * stepTime);
  report.finish(engine.model(), summary, logger);
  return 0;
}

}  // namespace

int runModelParallel(const TrainConfig& configIn, observe::Logger& logger) {
  TrainConfig config = configIn;
  const parallel::MeshShape shape = checkFlags(config);
  setNumThreads(config.threads);
  const RunData run = loadRunData(config);
  std::shared_ptr<comm::Communicator> world = joinJob(config, shape);
  if (dataParallel(config)) return runLanguageModelDataParallel(config, run, world, logger);

  train::ModelParallelOptions options;
  options.communicator = world;
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
  const Recipe recipe = run.recipe;
  train::ModelParallelEngine engine([&config, perBlock] {
                                      std::shared_ptr<nn::Sequential> model = buildModel(config);
                                      model->setRecompute(perBlock);
                                      return model;
                                    },
                                    [recipe](const parallel::NamedTensors& p) { return makeOptimizer(recipe, p); },
                                    options);

  RunReport report(config, run);
  train::FitCallbacks callbacks = train::injectFaults(config.faults, engine.rank());
  callbacks.onEnd = [&](const train::FitSummary&) {
    observe::Fields heldOut = report.heldOut(engine);
    // --save and the sample take the whole model on rank 0: the budget covers training.
    setTensorMemoryLimit(0);
    engine.gatherModel();
    return heldOut;
  };
  train::FitOptions fitOptionsHere = fitOptions(config, run, logger);
  fitOptionsHere.describe.update({{"mesh", config.mesh}});
  const train::FitSummary summary = train::fit(engine, run.train, run.validation, fitOptionsHere, callbacks);
  if (!engine.isPrimary()) return 0;
  printStageReport(config, engine, summary.ranks);
  report.finish(engine.model(), summary, logger);
  return 0;
}

}  // namespace kolo::cli
