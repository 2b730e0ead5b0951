// The single-process training engine behind `kolo train`: configuration (the CLI flags as
// a struct), recipe defaults, and a Trainer that runs epochs of a built-in model on
// Fashion-MNIST with metrics, progress and weights on disk. Distributed strategies plug in
// later at the step (Trainer::trainStep) and at the sampler (Trainer::makeSampler).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kolo/data.h"
#include "kolo/observe.h"
#include "kolo/optim.h"

namespace kolo::nn {
class Module;
}

namespace kolo::cli {

/// Everything `kolo train` can be told. Unset optionals take the recipe's defaults
/// (see resolveRecipe).
struct TrainConfig {
  std::string model = "mlp";      // mlp | cnn
  std::optional<int64_t> epochs;  // default: the recipe's
  int64_t steps = 0;              // total optimizer steps; 0 = all epochs
  int64_t batch = 128;
  std::optional<std::string> optimizer;  // sgd | adam | adamw
  std::optional<double> lr;
  std::optional<double> momentum;  // sgd only
  std::optional<double> weightDecay;
  bool nesterov = false;
  std::string schedule = "auto";       // auto | constant | cosine | warmup-cosine | step
  std::optional<int64_t> warmupSteps;  // default: half an epoch (warmup-cosine)
  double clipNorm = 0.0;               // 0: no clipping
  uint64_t seed = 0;
  bool shuffle = true;
  std::string dataDir = data::kFashionMnistDir;
  std::string initPath;
  std::string savePath;
  std::string metricsPath;
  int threads = 1;
  std::string strategy = "one-device";
  /// -1: a bar if stderr is a terminal, plain lines otherwise; 0: plain lines; 1: bar.
  int progress = -1;
  bool quiet = false;
};

/// The configuration after defaults: every optional filled in.
struct Recipe {
  std::string optimizer;
  double lr = 0.0;
  double momentum = 0.0;
  bool nesterov = false;
  double weightDecay = 0.0;
  int64_t epochs = 0;
  std::string schedule;
  int64_t warmupSteps = 0;
};

/// Fills the defaults. With neither --optimizer nor --lr, the default recipe: 10 epochs,
/// linear warm-up for half an epoch then cosine to zero, Nesterov SGD with momentum 0.9 and
/// lr 0.1 (mlp) / 0.05 (cnn). With --optimizer sgd: lr 0.05 (mlp) / 0.02 (cnn), momentum
/// 0.9; adam/adamw: lr 1e-3. Schedule "auto" is warm-up + cosine when --lr was not given
/// and constant when it was. Throws InvalidArgument for unknown names or bad values.
Recipe resolveRecipe(const TrainConfig& config, int64_t stepsPerEpoch);

/// Builds the optimizer of a recipe over `parameters`.
std::unique_ptr<optim::Optimizer> makeOptimizer(const Recipe& recipe,
                                                const optim::NamedParameters& parameters);
/// Builds the learning-rate schedule of a recipe for `totalSteps` optimizer steps.
std::unique_ptr<optim::LrSchedule> makeSchedule(const Recipe& recipe, int64_t totalSteps);

/// What a finished run reports.
struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs = 0;      // epochs begun
  double trainLoss = 0.0;  // mean loss over the last epoch's steps
  double testAccuracy = 0.0;
  double samplesPerSecond = 0.0;  // training samples per second of training time
  double wallSeconds = 0.0;
};

/// Fraction of `dataset` that `model` classifies correctly (argmax of the logits), in
/// chunks of `chunk` samples, without recording autograd; leaves the model in eval mode.
double evaluateAccuracy(nn::Module& model, const data::TensorDataset& dataset,
                        int64_t chunk = 1000);

/// Runs one training job as configured. Not thread-safe; one Trainer per run.
class Trainer {
 public:
  /// Loads the data, builds the model (seeded), loads --init weights, builds the optimizer
  /// and schedule. Throws kolo::Error subclasses with clear messages (missing dataset, bad
  /// flags, wrong-shape init file).
  explicit Trainer(TrainConfig config, observe::Logger& logger);
  virtual ~Trainer();

  /// Trains until --steps or the last epoch, evaluating after each epoch; writes metrics
  /// lines and the --save file.
  TrainSummary run();

  /// One optimizer step on `batch`: forward, loss, backward, update with learning rate
  /// `lr`. Returns the loss. The seam where strategies reduce gradients.
  virtual double trainStep(const data::Batch& batch, double lr);

  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const Recipe& recipe() const { return recipe_; }

 protected:
  /// The sampler for the training split (sequential with --no-shuffle, seeded shuffle
  /// otherwise).
  virtual std::shared_ptr<data::Sampler> makeSampler(int64_t trainSize) const;

 private:
  TrainConfig config_;
  observe::Logger& logger_;
  std::shared_ptr<data::TensorDataset> train_;
  std::shared_ptr<data::TensorDataset> test_;
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  Recipe recipe_;
  int64_t stepsPerEpoch_ = 0;
  int64_t totalSteps_ = 0;
};

}  // namespace kolo::cli
