// Shared set-up of the pipeline tests: a tiny `lm` (6 layers, so 4 stages fit) and the
// `mlp`, seeded data, SGD with momentum, and training loops for the unsplit model on one
// rank and for P pipeline stages as threads over the native communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolo/nn/language_model.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/pipeline.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"

namespace kolo::parallel::testing {

inline constexpr int64_t kPipeBatch = 8;

struct PipeCase {
  std::string model;  // "lm", "mlp", "cnn" or "resnet"
  int steps = 10;
};

inline std::shared_ptr<nn::Sequential> makePipeModel(const std::string& model) {
  Generator gen(4242);
  if (model == "mlp" || model == "cnn" || model == "resnet") return nn::makeModel(model, gen);
  return nn::makeLanguageModel({.vocab = 24, .layers = 3, .dModel = 16, .heads = 2, .seqLen = 6}, gen);
}

inline StageLossFn pipeLoss(const std::string& model) {
  if (model != "lm") return [](const Tensor& out, const Tensor& y) { return crossEntropy(out, y); };
  return [](const Tensor& out, const Tensor& y) { return nn::languageModelLoss(out, y); };
}

/// Batch of step `step`: lm token ids (B, length) and next tokens; mlp and cnn pixels (B, 784)
/// and classes.
/// Steps alternate between two fixed batches, so ten steps visibly lower the loss.
inline std::pair<Tensor, Tensor> pipeBatch(const std::string& model, int step, int64_t length = 6) {
  Generator gen(77 + static_cast<uint64_t>(step % 2));
  std::vector<int64_t> labels;
  if (model != "lm") {
    for (int64_t i = 0; i < kPipeBatch; ++i) labels.push_back(static_cast<int64_t>(gen.nextU64() % 10));
    return {Tensor::rand({kPipeBatch, 784}, gen), Tensor::fromVector({kPipeBatch}, labels)};
  }
  std::vector<int64_t> ids;
  // Each row counts up in steps of 5 (mod 24) from a random start: a pattern to learn.
  for (int64_t b = 0; b < kPipeBatch; ++b) {
    const int64_t start = static_cast<int64_t>(gen.nextU64() % 24);
    for (int64_t t = 0; t <= length; ++t) ids.push_back((start + 5 * t) % 24);
  }
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < kPipeBatch; ++b)
    for (int64_t t = 0; t < length; ++t) {
      x.push_back(ids[static_cast<size_t>(b * (length + 1) + t)]);
      y.push_back(ids[static_cast<size_t>(b * (length + 1) + t + 1)]);
    }
  return {Tensor::fromVector({kPipeBatch, length}, x), Tensor::fromVector({kPipeBatch, length}, y)};
}

inline std::unique_ptr<optim::Optimizer> pipeOptimizer(const optim::NamedParameters& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
}

struct PipeResult {
  std::vector<double> losses;  // per step
  std::vector<std::pair<std::string, Tensor>> state;  // whole model (gathered on rank 0)
  std::vector<PipelineStepStats> lastStats;           // per stage, of the last step
};

/// The unsplit model trained on one rank with the whole batch per step.
inline PipeResult trainUnsplit(const PipeCase& c) {
  auto model = makePipeModel(c.model);
  auto optimizer = pipeOptimizer(model->namedParameters());
  const StageLossFn loss = pipeLoss(c.model);
  PipeResult result;
  for (int s = 0; s < c.steps; ++s) {
    auto [x, y] = pipeBatch(c.model, s);
    optimizer->zeroGrad();
    Tensor l = loss(model->forward(x), y);
    l.backward();
    optimizer->step();
    result.losses.push_back(l.item());
  }
  result.state = model->stateDict();
  return result;
}

/// The unsplit model on one rank running the pipeline's M micro-batches one after another
/// (each loss weighing 1/M, one optimizer step per batch): what a pipeline of a model with batch
/// norm equals, since each micro-batch is normalised with its own statistics.
inline PipeResult trainMicroBatched(const PipeCase& c, int micro) {
  auto model = makePipeModel(c.model);
  auto optimizer = pipeOptimizer(model->namedParameters());
  const StageLossFn loss = pipeLoss(c.model);
  PipeResult result;
  const int64_t rows = kPipeBatch / micro;
  for (int s = 0; s < c.steps; ++s) {
    auto [x, y] = pipeBatch(c.model, s);
    optimizer->zeroGrad();
    double sum = 0;
    for (int m = 0; m < micro; ++m) {
      Tensor l = loss(model->forward(x.slice(0, m * rows, (m + 1) * rows).contiguous()),
                      y.slice(0, m * rows, (m + 1) * rows).contiguous());
      sum += l.item();
      (l * (1.0 / micro)).backward();
    }
    optimizer->step();
    result.losses.push_back(sum / micro);
  }
  result.state = model->stateDict();
  return result;
}

/// P stages as threads; `splits` empty: one layer cut as even as the layer count allows.
inline PipeResult trainPipelined(const PipeCase& c, int stages, PipelineOptions options,
                                 std::vector<int> splits = {}) {
  if (splits.empty()) {
    const int n = static_cast<int>(makePipeModel(c.model)->size());
    for (int s = 1; s < stages; ++s) splits.push_back(s * n / stages);
  }
  PipeResult result;
  result.lastStats.resize(static_cast<size_t>(stages));
  std::vector<std::vector<double>> losses(static_cast<size_t>(stages));
  auto commFor = nativeRanks(stages);
  auto whole = makePipeModel(c.model);
  runThreads(stages, [&](int rank) {
    auto comm = commFor(rank);
    PipelineStage stage(comm, *makePipeModel(c.model), splits, options, pipeLoss(c.model), pipeOptimizer);
    for (int s = 0; s < c.steps; ++s) {
      auto [x, y] = pipeBatch(c.model, s);
      const PipelineStepStats stats = stage.trainStep(x, y);
      losses[static_cast<size_t>(rank)].push_back(stats.loss);
      result.lastStats[static_cast<size_t>(rank)] = stats;
    }
    stage.gatherModel(rank == 0 ? whole.get() : nullptr, 0);
  });
  for (int r = 1; r < stages; ++r)
    if (losses[static_cast<size_t>(r)] != losses[0]) ADD_FAILURE() << "stage " << r << " reports other losses";
  result.losses = losses[0];
  result.state = whole->stateDict();
  return result;
}

inline std::vector<double> stateValues(const std::vector<std::pair<std::string, Tensor>>& state) {
  return flatValues(state);
}

}  // namespace kolo::parallel::testing
