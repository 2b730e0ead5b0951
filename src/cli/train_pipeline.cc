// `kolo train --model lm`, `--strategy pipeline` and `--strategy tensor`: the model cut into
// stages (one rank each; one stage on a lone rank), trained with micro-batches under the GPipe
// or 1F1B schedule (parallel::PipelineStage), or its layers split over --tp ranks
// (parallel::TensorParallelModel); `--model lm --strategy fsdp` shards it over the ranks
// (parallel::makeFsdpStrategy). Batches come from a byte-level text file (lm) or
// Fashion-MNIST (mlp, cnn); every rank draws the same global batch, the first stage reads
// its inputs and the last its labels. At the end rank 0 gathers the whole model, reports
// per-stage timings against the schedule's ideal, evaluates, saves, and for lm samples text.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <sstream>

#include "cli/train_loop.h"
#include "cli/train_model_state.h"
#include "cli/train_runners.h"
#include "kolo/autograd.h"
#include "kolo/byte_corpus.h"
#include "kolo/memory.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/parallel/mesh.h"
#include "kolo/parallel/pipeline.h"
#include "kolo/parallel/tensor_parallel.h"
#include "kolo/safetensors.h"
#include "kolo/serialize.h"
#include "kolo/threads.h"
#include "kolo/train/evaluate.h"

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

// Fashion-MNIST batches in an order that depends on the seed and the epoch only.
class ImageBatches {
 public:
  ImageBatches(const TrainConfig& config) : seed_(config.seed), shuffle_(config.shuffle), batch_(config.batch) {
    train_ = loadTrainingSet(config);
    test_ = std::make_shared<data::FashionMnist>(config.dataDir, false);
    stepsPerEpoch_ = train_->size() / batch_;
    KOLO_REQUIRE(stepsPerEpoch_ > 0, "--batch ", batch_, " is larger than the ", train_->size(),
                 " training samples");
  }
  data::Batch at(int64_t step) {
    const int64_t epoch = step / stepsPerEpoch_;
    if (epoch != orderEpoch_) {
      order_.resize(static_cast<size_t>(train_->size()));
      std::iota(order_.begin(), order_.end(), int64_t{0});
      if (shuffle_) {
        Generator gen(seed_ * 1000003 + static_cast<uint64_t>(epoch));
        for (size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[gen.nextU64() % (i + 1)]);
      }
      orderEpoch_ = epoch;
    }
    const auto first = order_.begin() + (step % stepsPerEpoch_) * batch_;
    return train_->gather(std::vector<int64_t>(first, first + batch_));
  }
  int64_t stepsPerEpoch() const { return stepsPerEpoch_; }
  const data::TensorDataset& test() const { return *test_; }

 private:
  uint64_t seed_;
  bool shuffle_;
  int64_t batch_;
  std::shared_ptr<data::TensorDataset> train_, test_;
  int64_t stepsPerEpoch_ = 0;
  int64_t orderEpoch_ = -1;
  std::vector<int64_t> order_;
};

// The model, or for lm only its layers [begin, end) (end < 0: all) with placeholders for the
// others, so that a stage never holds the whole model; --init fills what it holds.
std::shared_ptr<nn::Sequential> buildModel(const TrainConfig& config, int begin = 0, int end = -1) {
  Generator gen(config.seed);
  std::shared_ptr<nn::Sequential> model;
  const bool part = config.model == "lm" && end >= 0;
  if (config.model == "lm") {
    const nn::LanguageModelConfig sizes{.vocab = 256, .layers = config.layers, .dModel = config.dModel,
                                        .heads = config.heads, .seqLen = config.seqLen};
    model = part ? nn::makeLanguageModelPart(sizes, gen, begin, end) : nn::makeLanguageModel(sizes, gen);
  } else {
    model = nn::makeModel(config.model, gen);
  }
  if (!config.initPath.empty()) {
    if (!part) {
      kolo::load(*model, config.initPath);
    } else {
      std::vector<std::pair<std::string, Tensor>> mine;
      std::set<std::string> names;
      for (const auto& entry : model->stateDict()) names.insert(entry.first);
      for (auto& entry : checkpoint::loadSafetensors(config.initPath).tensors)
        if (names.count(entry.first)) mine.push_back(std::move(entry));
      model->loadStateDict(mine, config.initPath);
    }
  }
  return model;
}

int64_t layerCount(const TrainConfig& config) {
  if (config.model == "lm") return config.layers + 3;
  Generator gen(0);
  return static_cast<int64_t>(nn::makeModel(config.model, gen)->size());
}

std::string costsText(const std::vector<double>& costs) {
  std::string text;
  char one[32];
  for (double c : costs) {
    std::snprintf(one, sizeof(one), "%s%.2f", text.empty() ? "" : " ", 1000.0 * c);
    text += one;
  }
  return text;
}

long peakRssKib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

}  // namespace

int runModelParallel(const TrainConfig& configIn, observe::Logger& logger) {
  TrainConfig config = configIn;
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
  KOLO_REQUIRE(pipeline || tensor || fsdp || config.strategy == "one-device", "--model lm trains with "
               "--strategy one-device, pipeline, tensor or fsdp, not ", config.strategy);
  KOLO_REQUIRE(config.tp >= 1, "--tp must be at least 1, got ", config.tp);
  KOLO_REQUIRE(
      tensor || config.tp == 1 || !config.mesh.empty(), "--tp ", config.tp,
      " needs --strategy tensor (pipeline stages split over tensor groups: --mesh dp=1,pp=P,tp=T)");
  KOLO_REQUIRE(!(tensor || fsdp) || (config.microBatches == 1 && config.stages == 1 && !config.recompute &&
                                     config.splitAt.empty()),
               "--strategy ", config.strategy, " takes no --stages, --micro-batches, --split-at or --recompute");
  KOLO_REQUIRE(tensor || config.tp > 1 || !config.sequenceParallel,
               "--sequence-parallel needs --strategy tensor (or a mesh with tp)");
  KOLO_REQUIRE(lm || !config.sequenceParallel, "--sequence-parallel works with --model lm only");
  KOLO_REQUIRE(config.checkpointEvery >= 0, "--checkpoint-every must be at least 0, got ",
               config.checkpointEvery);
  refuseReducerFlags(config, "--model lm or --strategy " + config.strategy);
  KOLO_REQUIRE(config.clipNorm == 0.0 || fsdp, "--clip-norm is not available with --model lm or "
               "--strategy pipeline or tensor, except under --strategy fsdp");
  KOLO_REQUIRE(config.stages >= 1 && config.microBatches >= 1, "--stages and --micro-batches must be at least 1");
  KOLO_REQUIRE(pipeline || config.stages == 1, "--stages ", config.stages, " needs --strategy pipeline");
  const parallel::PipelineSchedule schedule = parallel::parsePipelineSchedule(config.pipelineSchedule);
  if (lm && !config.batchGiven) config.batch = kDefaultLmBatch;
  KOLO_REQUIRE(config.batch % (shape.dp * config.microBatches) == 0, "--batch ", config.batch,
               " cannot be split into ", shape.dp * config.microBatches, " equal micro-batches (",
               shape.dp, " replica(s) x ", config.microBatches, "): use a multiple of --micro-batches",
               shape.dp > 1 ? " times the mesh's dp" : "");
  setNumThreads(config.threads);

  // The recipe. lm without --optimizer and --lr: AdamW at 2e-3, warm-up over a tenth of the
  // run, then cosine decay.
  std::unique_ptr<data::ByteCorpus> corpus;
  std::unique_ptr<ImageBatches> images;
  int64_t totalSteps = 0;
  if (lm) {
    const std::string path = config.dataDir == data::kFashionMnistDir ? kDefaultText : config.dataDir;
    corpus = std::make_unique<data::ByteCorpus>(path, config.seqLen);
    totalSteps = config.steps > 0 ? config.steps : kDefaultLmSteps;
    if (!config.optimizer && !config.lr) {
      config.optimizer = "adamw";
      config.lr = 2e-3;
      if (config.schedule == "auto") config.schedule = "warmup-cosine";
      if (!config.warmupSteps) config.warmupSteps = totalSteps / 10;
    }
  } else {
    images = std::make_unique<ImageBatches>(config);
  }
  const Recipe recipe = resolveRecipe(config, images ? images->stepsPerEpoch() : totalSteps);
  if (images) {
    totalSteps = recipe.epochs * images->stepsPerEpoch();
    if (config.steps > 0) totalSteps = config.epochs ? std::min(totalSteps, config.steps) : config.steps;
  }
  const auto lrSchedule = makeSchedule(recipe, totalSteps);
  // Every rank draws the global batch; a data-parallel replica keeps its rows.
  int replica = 0;
  auto batchAt = [&](int64_t step) {
    data::Batch b = !corpus              ? images->at(step)
                    : config.shuffle ? corpus->batch(step, config.batch, config.seed)
                                     : corpus->fileOrderBatch(step, config.batch);
    if (shape.dp == 1) return b;
    const int64_t rows = config.batch / shape.dp;
    b.inputs = b.inputs.slice(0, replica * rows, (replica + 1) * rows).contiguous();
    b.labels = b.labels.slice(0, replica * rows, (replica + 1) * rows).contiguous();
    return b;
  };

  // The job's ranks; the model group (one replica: its stages, its tensor ranks, or both);
  // the stages of this rank's tensor rank; the tensor ranks of this rank's stage.
  std::shared_ptr<comm::Communicator> world, group, pipelineComm, tensorComm;
  parallel::MeshGroups mesh;
  if (!config.mesh.empty()) {
    world = parallel::init();
    mesh = parallel::makeMesh(*world, shape);
    group = mesh.model;
    pipelineComm = mesh.pipeline;
    tensorComm = mesh.tensor;
    replica = mesh.replica;
  } else if (fsdp) {
    world = group = parallel::init();
    KOLO_REQUIRE(config.batch % world->size() == 0, "--batch ", config.batch, " does not split evenly over ",
                 world->size(), " fsdp ranks: use a multiple of ", world->size());
  } else if (tensor) {
    world = group = tensorComm = parallel::init();
    KOLO_REQUIRE(world->size() == config.tp, "--tp ", config.tp, " needs ", config.tp,
                 " ranks, this job has ", world->size(), ": run it under kolo run -n ", config.tp);
  } else if (config.stages > 1) {
    world = group = pipelineComm = parallel::init();
    KOLO_REQUIRE(world->size() == config.stages, "--stages ", config.stages, " needs ",
                 config.stages, " ranks (one per stage), this job has ", world->size(),
                 ": run it under kolo run -n ", config.stages);
  }
  const int stageIndex = pipelineComm ? pipelineComm->rank() : 0;
  const bool primary = !world || world->rank() == 0;

  // Every rank builds the model from the same seed (or --init file), only its own layers when
  // the split points are given, and keeps its stage.
  std::vector<int> splits;
  std::vector<double> layerCosts;
  {
    std::shared_ptr<nn::Sequential> model;
    if (!config.splitAt.empty()) {
      splits = parseSplits(config.splitAt);
      // Given split points: build only this rank's layers (the stage checks the points).
      std::vector<int> bounds = {0};
      bounds.insert(bounds.end(), splits.begin(), splits.end());
      bounds.push_back(static_cast<int>(layerCount(config)));
      const bool fits = static_cast<int>(splits.size()) == config.stages - 1 &&
                        std::is_sorted(bounds.begin(), bounds.end()) &&
                        std::adjacent_find(bounds.begin(), bounds.end()) == bounds.end();
      model = fits ? buildModel(config, bounds[static_cast<size_t>(stageIndex)],
                                bounds[static_cast<size_t>(stageIndex) + 1])
                   : buildModel(config);
    } else {
      model = buildModel(config);
    }
    if (config.splitAt.empty() && config.stages > 1) {
      // World rank 0 measures, so that every replica and tensor rank cuts alike.
      const Tensor rows = batchAt(0).inputs;
      const Tensor sample = rows.slice(0, 0, rows.shape()[0] / config.microBatches).contiguous();
      splits = parallel::measuredSplit(*world, *model, sample, 3, &layerCosts, config.stages);
    }
    parallel::StageLossFn loss;
    if (lm) {
      loss = [](const Tensor& out, const Tensor& y) { return nn::languageModelLoss(out, y); };
    } else {
      loss = [](const Tensor& out, const Tensor& y) { return crossEntropy(out, y); };
    }
    parallel::PipelineOptions options{.microBatches = config.microBatches,
                                      .schedule = schedule,
                                      .recompute = config.recompute};
    const parallel::TensorParallelOptions tpOptions{.sequenceParallel = config.sequenceParallel};
    std::unique_ptr<Runner> stage;
    if (fsdp) {
      stage = makeFsdpRunner(group, model, loss, recipe,
                             parallel::FsdpOptions{.shard = parallel::parseShardLevel(config.shard),
                                                   .shardGroup = shardGroupSize(config, group->size()),
                                                   .clipNorm = config.clipNorm,
                                                   .unitMinParameters = config.unitParams});
    } else if (tensor) {
      stage = makeTensorRunner(tensorComm, *model, tpOptions, recipe, mesh.data);
    } else {
      // Stages of a mesh with tp > 1 are cut from the tensor-parallel model, whose loss
      // takes logits split by vocabulary.
      std::shared_ptr<parallel::TensorParallelModel> tp;
      if (config.tp > 1) {
        tp = std::make_shared<parallel::TensorParallelModel>(*model, tensorComm, tpOptions);
        loss = [tp](const Tensor& out, const Tensor& y) { return tp->loss(out, y); };
      }
      stage = makePipelineRunner(
          std::make_unique<parallel::PipelineStage>(
              pipelineComm, tp ? static_cast<const nn::Sequential&>(*tp) : *model, splits, options,
              loss,
              [&recipe](const optim::NamedParameters& p) { return makeOptimizer(recipe, p); }),
          mesh.data, tp);
    }
    model.reset();  // the stage holds its own layers (or shards); the others go
    std::vector<int> bounds = stage->bounds();
    if (primary) {
      std::string text;
      for (size_t s = 0; s + 1 < bounds.size(); ++s)
        text += (s ? " " : "") + std::to_string(bounds[s]) + "-" + std::to_string(bounds[s + 1] - 1);
      logger.info("training",
                  {{"model", config.model},
                   {"rank_parameters", stage->parameterCount()},
                   {"strategy", config.strategy},
                   {"tp", config.tp},
                   {"sequence_parallel", config.sequenceParallel},
                   {"dp", shape.dp},
                   {"stages", config.stages},
                   {"micro_batches", config.microBatches},
                   {"schedule", config.pipelineSchedule},
                   {"recompute", config.recompute},
                   {"stage_layers", text},
                   {"split", config.splitAt.empty() && config.stages > 1 ? "measured" : "given"},
                   {"layer_ms", costsText(layerCosts)},
                   {"optimizer", recipe.optimizer},
                   {"lr", recipe.lr},
                   {"batch", config.batch},
                   {"steps", totalSteps}});
    }

    // --resume: every rank continues from its part of the newest good checkpoint (under fsdp
    // from the whole state, of which it then keeps its shards).
    int64_t firstStep = 0;
    if (!config.resumeDir.empty()) {
      firstStep = resumeModelPart(config, world.get(), stage->statePart(), logger);
      stage->stateLoaded();
    }
    // Only replica 0's model group writes checkpoints (the others hold the same weights); its
    // ranks' parts are gathered to its rank 0, except under fsdp, where every rank assembles the
    // whole state and world rank 0 alone writes it.
    auto checkpointAt = [&](int64_t step) {
      if (config.checkpointDir.empty() || replica != 0) return;
      const ModelPart state = stage->statePart();
      if (!fsdp || primary)
        saveModelCheckpoint(config, recipe, fsdp ? nullptr : group.get(), state, step, logger);
    };
    RunMetrics metrics(primary ? config.metricsPath : "", firstStep);
    metrics.event(firstStep > 0 ? "resume" : "start", firstStep,
                  {{"ranks", world ? world->size() : 1},
                   {"strategy", config.strategy},
                   {"mesh", config.mesh},
                   {"batch", config.batch}});

    // The loop. Timings leave out the first steps (allocation, first touches).
    const int64_t skip = std::min<int64_t>(config.timingSkip, totalSteps / 4);
    const int64_t every = std::max<int64_t>(1, totalSteps / 10);
    double computeSum = 0.0, stepSum = 0.0, lossWindow = 0.0, lastLoss = 0.0;
    double intervalCompute = 0.0, intervalStep = 0.0;
    int64_t timed = 0, windowCount = 0;
    int64_t peakTensors = 0;  // the most tensor bytes alive at once during any step
    parallel::PipelineStepStats peak;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t step = firstStep; step < totalSteps; ++step) {
      const data::Batch batch = batchAt(step);
      killIfAsked(config, world ? world->rank() : 0, step);
      if (step == config.failStep && (world ? world->rank() : 0) == config.failRank)
        KOLO_THROW(Error, "rank ", config.failRank, ": failure injected before step ", step,
                   " (--fail-at-step)");
      stage->optimizer().setLr(lrSchedule->lrAt(step));
      const int64_t before = liveTensorBytes();
      const parallel::PipelineStepStats stats = stage->trainStep(batch.inputs, batch.labels);
      peakTensors = std::max(peakTensors, before + stats.peakStepBytes);
      peak.peakStepBytes = std::max(peak.peakStepBytes, stats.peakStepBytes);
      if (!std::isfinite(stats.loss))
        KOLO_THROW(DivergedError, "training diverged: loss ", stats.loss, " at step ", step, " (lr ",
                   lrSchedule->lrAt(step), "); try a smaller --lr");
      peak.peakMicroBatchesHeld = std::max(peak.peakMicroBatchesHeld, stats.peakMicroBatchesHeld);
      peak.peakBoundaryBytes = std::max(peak.peakBoundaryBytes, stats.peakBoundaryBytes);
      if (step >= skip) {
        computeSum += stats.computeSeconds;
        stepSum += stats.stepSeconds;
        ++timed;
      }
      lossWindow += stats.loss;
      intervalCompute += stats.computeSeconds;
      intervalStep += stats.stepSeconds;
      ++windowCount;
      lastLoss = stats.loss;
      if ((step + 1) % every == 0 || step + 1 == totalSteps) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (primary && !config.quiet)
          std::fprintf(stderr, "step %lld/%lld  loss %.4f  %.1f ms/step  %.0f s\n",
                       static_cast<long long>(step + 1), static_cast<long long>(totalSteps),
                       lossWindow / windowCount, 1000.0 * stats.stepSeconds, elapsed);
        metrics.interval(step + 1, {{"train_loss", lossWindow / windowCount},
                                    {"step_s", intervalStep / windowCount},
                                    {"compute_s", intervalCompute / windowCount},
                                    {"lr", stage->optimizer().lr()},
                                    {"wall_s", elapsed}});
        lossWindow = intervalCompute = intervalStep = 0.0;
        windowCount = 0;
      }
      if (config.checkpointEvery > 0 && (step + 1) % config.checkpointEvery == 0 &&
          step + 1 < totalSteps)
        checkpointAt(step + 1);
    }
    if (firstStep < totalSteps) checkpointAt(totalSteps);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Per-stage figures to rank 0: compute and step time per step, held micro-batches,
    // boundary bytes, peak resident memory.
    const int parts = group ? group->size() : 1;  // ranks of the model group, s·tp + t
    std::vector<double> mine = {timed ? computeSum / timed : 0.0, timed ? stepSum / timed : 0.0,
                                static_cast<double>(peak.peakMicroBatchesHeld),
                                static_cast<double>(peak.peakBoundaryBytes), static_cast<double>(peakRssKib()),
                                static_cast<double>(peak.peakStepBytes), static_cast<double>(peakTensors)};
    std::vector<double> all(mine.size() * static_cast<size_t>(parts));
    if (group) {
      group->allgather(mine.data(), all.data(), mine.size(), DType::F64);
    } else {
      all = mine;
    }
    // Replica 0's model group gathers the model; the other replicas hold the same weights.
    if (replica != 0) return 0;
    // The budget covers training; rank 0 gathers the whole model outside it (--save, sample).
    setTensorMemoryLimit(0);
    stage->gatherWhole();
    const checkpoint::NamedTensors gathered = gatherWholeWeights(fsdp ? nullptr : group.get(), stage->part());
    stage.reset();
    if (!primary) return 0;
    auto whole = buildModel(config);
    checkpoint::copyIntoTensors({gathered, {}}, whole->stateDict(), true, "the gathered model");

    double slowest = 0.0, stepTime = 0.0;
    for (int r = 0; r < parts; ++r) {
      const double* f = &all[static_cast<size_t>(r) * mine.size()];
      slowest = std::max(slowest, f[0]);
      stepTime = std::max(stepTime, f[1]);
      // Model group rank r = s·tp + t holds stage s (all layers under tensor parallelism).
      const size_t s = tensor || fsdp ? 0 : static_cast<size_t>(r / config.tp);
      char who[48];
      if (config.tp > 1 && !tensor) {
        std::snprintf(who, sizeof who, "stage %zu rank %d", s, r % config.tp);
      } else {
        std::snprintf(who, sizeof who, "%s %d", tensor || fsdp ? "rank" : "stage", r);
      }
      if (!config.quiet)
        std::fprintf(
            stderr,
            "%s: layers %d-%d  compute %.1f ms/step  step %.1f ms  peak micro-batches held %d  "
            "peak boundary activations %.2f MiB  peak step memory %.2f MiB  peak tensors %.2f MiB  "
            "peak rss %.1f MiB\n",
            who, bounds[s], bounds[s + 1] - 1, 1000.0 * f[0], 1000.0 * f[1], static_cast<int>(f[2]),
            f[3] / (1 << 20), f[5] / (1 << 20), f[6] / (1 << 20), f[4] / 1024.0);
    }
    const int m = config.microBatches, stages = config.stages;
    const double ideal = slowest * (m + stages - 1) / m;
    if (tensor || fsdp) {
      std::printf("%s ranks %d step_ms %.2f\n", fsdp ? "fsdp" : "tensor_parallel", parts, 1000.0 * stepTime);
    } else {
      std::printf("pipeline stages %d micro_batches %d schedule %s step_ms %.2f ideal_ms %.2f measured_over_ideal %.3f\n",
                  stages, m, config.pipelineSchedule.c_str(), 1000.0 * stepTime, 1000.0 * ideal,
                  ideal > 0 ? stepTime / ideal : 0.0);
    }

    if (!config.savePath.empty()) {
      checkpoint::saveSafetensors(config.savePath, whole->namedParameters(),
                                  {{"format", "pt"}, {"model", config.model}, {"step", std::to_string(totalSteps)}});
      logger.info("saved weights", {{"file", config.savePath}});
    }
    if (lm) {
      // Held-out loss over 8 batches of the last tenth of the text, then a sample.
      double heldOut = 0.0;
      {
        autograd::NoGradGuard noGrad;
        whole->train(false);
        for (int64_t i = 0; i < 8; ++i) {
          const data::Batch b = corpus->batch(i, config.batch, config.seed, true);
          heldOut += nn::languageModelLoss(whole->forward(b.inputs), b.labels).item() / 8;
        }
      }
      std::printf("train_loss %.4f held_out_loss %.4f steps %lld wall_s %.1f\n", lastLoss, heldOut,
                  static_cast<long long>(totalSteps), wall);
      metrics.event("end", totalSteps);
      metrics.final(totalSteps,
                    {{"train_loss", lastLoss}, {"held_out_loss", heldOut}, {"wall_s", wall}});
      Generator gen(config.seed + 1);
      // The prompt: the start of the held-out part, text the model did not train on.
      const std::string prompt = corpus->text(corpus->trainBytes(), std::min<int64_t>(32, config.seqLen));
      const std::string text = nn::generateText(*whole, prompt, config.sampleBytes, config.seqLen, 0.8, gen);
      std::string shown;
      for (char c : text) shown.push_back((c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? c : '?');
      std::printf("sample:\n%s\n", shown.c_str());
    } else {
      const double accuracy = train::evaluate(*whole, images->test()).accuracy;
      std::printf("test_accuracy %.4f train_loss %.4f steps %lld wall_s %.1f\n", accuracy, lastLoss,
                  static_cast<long long>(totalSteps), wall);
      metrics.event("end", totalSteps);
      metrics.final(totalSteps,
                    {{"train_loss", lastLoss}, {"test_accuracy", accuracy}, {"wall_s", wall}});
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace kolo::cli
