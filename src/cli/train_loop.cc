// The Trainer: data, model, optimizer and schedule from a TrainConfig, then the epoch loop
// with evaluation, metrics lines, progress and weights on disk.
#include "cli/train_loop.h"

#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "kolo/autograd.h"
#include "kolo/nn/models.h"
#include "kolo/safetensors.h"

namespace kolo::cli {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string formatRate(double samplesPerSecond) {
  char text[32];
  if (samplesPerSecond >= 1000) {
    std::snprintf(text, sizeof(text), "%.1fk", samplesPerSecond / 1000);
  } else {
    std::snprintf(text, sizeof(text), "%.0f", samplesPerSecond);
  }
  return text;
}

}  // namespace

Recipe resolveRecipe(const TrainConfig& config, int64_t stepsPerEpoch) {
  KOLO_CHECK(config.model == "mlp" || config.model == "cnn", "unknown --model '", config.model,
             "' (mlp, cnn)");
  KOLO_CHECK(config.batch > 0, "--batch must be positive, got ", config.batch);
  KOLO_CHECK(config.steps >= 0, "--steps must be >= 0, got ", config.steps);
  Recipe recipe;
  // The default recipe (neither --optimizer nor --lr): Nesterov SGD, momentum 0.9, lr 0.1
  // for the mlp and 0.05 for the cnn, warm-up + cosine over 10 epochs.
  const bool defaultRecipe = !config.optimizer && !config.lr;
  recipe.optimizer = config.optimizer.value_or("sgd");
  KOLO_CHECK(recipe.optimizer == "sgd" || recipe.optimizer == "adam" || recipe.optimizer == "adamw",
             "unknown --optimizer '", recipe.optimizer, "' (sgd, adam, adamw)");
  if (recipe.optimizer == "sgd") {
    const bool mlp = config.model == "mlp";
    // Without --lr: the default recipe's rates, or the peers' constant-rate recipe's.
    recipe.lr = config.lr.value_or(defaultRecipe ? (mlp ? 0.1 : 0.05) : (mlp ? 0.05 : 0.02));
    recipe.momentum = config.momentum.value_or(0.9);
    recipe.nesterov = config.nesterov || defaultRecipe;
  } else {
    recipe.lr = config.lr.value_or(1e-3);
    KOLO_CHECK(!config.momentum && !config.nesterov,
               "--momentum and --nesterov apply to --optimizer sgd only");
  }
  recipe.weightDecay = config.weightDecay.value_or(recipe.optimizer == "adamw" ? 0.01 : 0.0);
  recipe.epochs = config.epochs.value_or(10);
  KOLO_CHECK(recipe.epochs > 0, "--epochs must be positive, got ", recipe.epochs);
  KOLO_CHECK(recipe.lr > 0.0 && std::isfinite(recipe.lr), "--lr must be positive, got ", recipe.lr);
  recipe.schedule = config.schedule;
  if (recipe.schedule == "auto") recipe.schedule = config.lr ? "constant" : "warmup-cosine";
  KOLO_CHECK(recipe.schedule == "constant" || recipe.schedule == "cosine" ||
                 recipe.schedule == "warmup-cosine" || recipe.schedule == "step",
             "unknown --schedule '", config.schedule,
             "' (auto, constant, cosine, warmup-cosine, step)");
  recipe.warmupSteps =
      config.warmupSteps.value_or(recipe.schedule == "warmup-cosine" ? stepsPerEpoch / 2 : 0);
  KOLO_CHECK(recipe.warmupSteps >= 0, "--warmup-steps must be >= 0");
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
  optim::AdamOptions options{.lr = recipe.lr, .weightDecay = recipe.weightDecay};
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

double evaluateAccuracy(nn::Module& model, const data::TensorDataset& dataset, int64_t chunk) {
  autograd::NoGradGuard noGrad;
  model.train(false);
  const int64_t n = dataset.size();
  const std::vector<double> labels = dataset.labels().toDoubleVector();
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(begin + chunk, n);
    Tensor logits =
        model.forward(dataset.inputs().slice(0, begin, end)).contiguous();  // (b, classes)
    const int64_t classes = logits.size(1);
    const float* values = logits.data<float>();
    for (int64_t i = 0; i < end - begin; ++i) {
      const float* row = values + i * classes;
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (row[c] > row[best]) best = c;
      }
      correct += best == static_cast<int64_t>(labels[begin + i]);
    }
  }
  return n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0.0;
}

Trainer::Trainer(TrainConfig config, observe::Logger& logger)
    : config_(std::move(config)), logger_(logger) {
  KOLO_CHECK(config_.strategy == "one-device", "--strategy '", config_.strategy,
             "' is not available in this build (one-device)");
  KOLO_CHECK(config_.threads >= 1, "--threads must be >= 1, got ", config_.threads);
  openblas_set_num_threads(config_.threads);
  // Validate the flags before the (slow) data loading.
  recipe_ = resolveRecipe(config_, 1);

  train_ = std::make_shared<data::FashionMnist>(config_.dataDir, true);
  test_ = std::make_shared<data::FashionMnist>(config_.dataDir, false);
  stepsPerEpoch_ = (train_->size() + config_.batch - 1) / config_.batch;
  recipe_ = resolveRecipe(config_, stepsPerEpoch_);
  // --steps is the total step count: it cuts --epochs short, or alone sets the length.
  totalSteps_ = recipe_.epochs * stepsPerEpoch_;
  if (config_.steps > 0)
    totalSteps_ = config_.epochs ? std::min(totalSteps_, config_.steps) : config_.steps;

  Generator generator(config_.seed);
  model_ = nn::makeModel(config_.model, generator);
  if (!config_.initPath.empty()) {
    checkpoint::loadSafetensorsInto(config_.initPath, model_->namedParameters());
    logger_.info("loaded initial weights", {{"file", config_.initPath}});
  }
  optimizer_ = makeOptimizer(recipe_, model_->namedParameters());
  schedule_ = makeSchedule(recipe_, totalSteps_);
}

Trainer::~Trainer() = default;

std::shared_ptr<data::Sampler> Trainer::makeSampler(int64_t trainSize) const {
  if (!config_.shuffle) return std::make_shared<data::SequentialSampler>(trainSize);
  return std::make_shared<data::ShuffleSampler>(trainSize, config_.seed);
}

double Trainer::trainStep(const data::Batch& batch, double lr) {
  model_->train(true);
  Tensor logits = model_->forward(batch.inputs);         // (B, 10)
  Tensor loss = nn::crossEntropy(logits, batch.labels);  // ()
  optimizer_->zeroGrad();
  loss.backward();
  if (config_.clipNorm > 0.0) {
    std::vector<Tensor> parameters;
    for (auto& [name, parameter] : model_->namedParameters()) parameters.push_back(parameter);
    optim::clipGradNorm(parameters, config_.clipNorm);
  }
  optimizer_->setLr(lr);
  optimizer_->step();
  return loss.item();
}

TrainSummary Trainer::run() {
  const auto start = Clock::now();
  std::unique_ptr<observe::MetricsWriter> metrics;
  if (!config_.metricsPath.empty())
    metrics = std::make_unique<observe::MetricsWriter>(config_.metricsPath);
  data::DataLoader loader(train_, makeSampler(train_->size()),
                          {.batchSize = config_.batch, .prefetch = 2});
  const int64_t epochs = (totalSteps_ + stepsPerEpoch_ - 1) / stepsPerEpoch_;
  logger_.info("training", {{"model", config_.model},
                            {"optimizer", recipe_.optimizer},
                            {"lr", recipe_.lr},
                            {"schedule", recipe_.schedule},
                            {"batch", config_.batch},
                            {"epochs", epochs},
                            {"steps", totalSteps_},
                            {"strategy", config_.strategy}});

  TrainSummary summary;
  double trainSeconds = 0.0;
  int64_t trainSamples = 0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs && step < totalSteps_; ++epoch) {
    const int64_t epochSteps = std::min(stepsPerEpoch_, totalSteps_ - step);
    observe::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs),
                             epochSteps, stderr, 100, config_.progress);
    double lossSum = 0.0;
    int64_t lossCount = 0;
    const auto epochStart = Clock::now();
    int64_t epochSamples = 0;
    data::Batch batch;
    while (step < totalSteps_ && loader.next(batch)) {
      const double loss = trainStep(batch, schedule_->lrAt(step));
      KOLO_CHECK(std::isfinite(loss), "training diverged: loss ", loss, " at step ", step);
      ++step;
      lossSum += loss;
      ++lossCount;
      epochSamples += batch.labels.size(0);
      if (!config_.quiet) {
        char suffix[96];
        std::snprintf(suffix, sizeof(suffix), "loss %.4f  %s samples/s", lossSum / lossCount,
                      formatRate(epochSamples / std::max(secondsSince(epochStart), 1e-9)).c_str());
        bar.update(lossCount, suffix);
      }
    }
    // A run stopped by --steps mid-epoch leaves the loader where it is; a full epoch ends
    // with next() returning false, which moves the loader to the next epoch.
    const double epochSeconds = secondsSince(epochStart);
    trainSeconds += epochSeconds;
    trainSamples += epochSamples;
    summary.trainLoss = lossCount > 0 ? lossSum / lossCount : 0.0;
    summary.testAccuracy = evaluateAccuracy(*model_, *test_);
    summary.epochs = epoch + 1;
    const double rate = epochSamples / std::max(epochSeconds, 1e-9);
    if (!config_.quiet) {
      char suffix[128];
      std::snprintf(suffix, sizeof(suffix), "loss %.4f  test accuracy %.4f  %s samples/s",
                    summary.trainLoss, summary.testAccuracy, formatRate(rate).c_str());
      bar.finish(suffix);
    }
    if (metrics) {
      metrics->write({{"epoch", epoch + 1},
                      {"step", step},
                      {"train_loss", summary.trainLoss},
                      {"test_accuracy", summary.testAccuracy},
                      {"samples_per_s", rate},
                      {"wall_s", secondsSince(start)},
                      {"lr", optimizer_->lr()}});
    }
  }
  summary.steps = step;
  summary.samplesPerSecond = trainSamples / std::max(trainSeconds, 1e-9);
  if (!config_.savePath.empty()) {
    checkpoint::saveSafetensors(
        config_.savePath, model_->namedParameters(),
        {{"format", "pt"}, {"model", config_.model}, {"step", std::to_string(step)}});
    logger_.info("saved weights", {{"file", config_.savePath}});
  }
  summary.wallSeconds = secondsSince(start);
  if (metrics) {
    metrics->write({{"epoch", summary.epochs},
                    {"step", summary.steps},
                    {"train_loss", summary.trainLoss},
                    {"test_accuracy", summary.testAccuracy},
                    {"samples_per_s", summary.samplesPerSecond},
                    {"wall_s", summary.wallSeconds},
                    {"final", true}});
  }
  return summary;
}

}  // namespace kolo::cli
