// What every `kolo train` runner shares: recipe defaults, optimizer and schedule, the
// training data, fsdp's shard group.
#include "cli/train_loop.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>

#include "kolo/comm/init.h"
#include "kolo/error.h"
#include "kolo/safetensors.h"

namespace kolo::cli {

std::shared_ptr<data::TensorDataset> loadTrainingSet(const TrainConfig& config) {
  // Only the samples used are read: a short run does not inflate the whole split.
  return std::make_shared<data::FashionMnist>(config.dataDir, true, config.trainLimit);
}

// --init names the user's file: not finding it, or weights that do not fit the model, is an
// input-file error (exit code 3), like a malformed file.
void loadInitialWeights(const std::string& path, nn::Module& model) {
  try {
    checkpoint::loadSafetensorsInto(path, model.stateDict());
  } catch (const FileError&) {
    throw;
  } catch (const InternalError&) {
    throw;  // kolo's own invariant, not the file's fault
  } catch (const IoError& e) {
    throw FileError(e.what());
  } catch (const InvalidArgument& e) {
    throw FileError(e.what());
  }
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
  return optim::makeOptimizer({.name = recipe.optimizer, .lr = recipe.lr, .momentum = recipe.momentum,
                               .nesterov = recipe.nesterov, .beta1 = recipe.beta1, .weightDecay = recipe.weightDecay},
                              parameters);
}

std::unique_ptr<optim::LrSchedule> makeSchedule(const Recipe& recipe, int64_t totalSteps) {
  return optim::makeSchedule({.name = recipe.schedule, .lr = recipe.lr, .warmupSteps = recipe.warmupSteps},
                             totalSteps);
}

std::map<std::string, std::string> runIdentity(const TrainConfig& config) {
  std::map<std::string, std::string> identity = {{"model", config.model},
                                                 {"batch", std::to_string(config.batch)},
                                                 {"seed", std::to_string(config.seed)}};
  if (config.model == "lm") {
    identity["layers"] = std::to_string(config.layers);
    identity["d_model"] = std::to_string(config.dModel);
    identity["seq_len"] = std::to_string(config.seqLen);
  }
  return identity;
}

train::FitOptions fitOptions(const TrainConfig& config, const Recipe& recipe, observe::Logger& logger) {
  train::FitOptions options;
  // --epochs given: the run ends at the first of --epochs and --steps; --steps alone sets it.
  options.epochs = config.epochs ? *config.epochs : (config.steps > 0 ? 0 : recipe.epochs);
  options.steps = config.steps;
  options.batch = config.batch;
  options.shuffle = config.shuffle;
  options.seed = config.seed;
  options.dropLast = config.dropLast;
  options.schedule = [&recipe](int64_t totalSteps, int64_t) { return makeSchedule(recipe, totalSteps); };
  options.metricsPath = config.metricsPath;
  options.metricsEvery = config.metricsEvery;
  options.progress = config.progress;
  options.quiet = config.quiet;
  options.statusFile = config.statusFile;
  options.timingSkip = config.timingSkip;
  options.checkpointDir = config.checkpointDir;
  options.checkpointEvery = config.checkpointEvery;
  options.keepCheckpoints = config.keepCheckpoints;
  options.resumeDir = config.resumeDir;
  options.identity = runIdentity(config);
  options.logger = &logger;
  options.describe = {{"model", config.model},
                      {"optimizer", recipe.optimizer},
                      {"lr", recipe.lr},
                      {"schedule", recipe.schedule}};
  return options;
}

int shardGroupSize(const TrainConfig& config, int worldSize) {
  KOLO_REQUIRE(!config.hsdp || config.shardGroup == 0, "--hsdp sets the shard group to the ranks "
               "of one host; give it or --shard-group ", config.shardGroup, ", not both");
  const int group = config.hsdp ? std::max(1, comm::detectLaunch().localSize) : config.shardGroup;
  KOLO_REQUIRE(group == 0 || worldSize % group == 0, config.hsdp ? "--hsdp: " : "",
               "a shard group of ", group, " ranks does not divide the job's ", worldSize,
               " ranks");
  return group;
}

}  // namespace kolo::cli
