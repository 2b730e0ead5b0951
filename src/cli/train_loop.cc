// What every `kolo train` runner shares: the recipe's defaults, the built-in model and its
// --init weights, the run's identity and --save.
#include "cli/train_loop.h"

#include <set>

#include "kolo/error.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/models.h"
#include "kolo/safetensors.h"

namespace kolo::cli {
namespace {

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

}  // namespace

// The flag table (train_flags.cc) has checked each value on its own; what is left is which
// flags the optimizer takes.
Recipe resolveRecipe(const TrainConfig& config, int64_t stepsPerEpoch) {
  Recipe recipe;
  optim::OptimizerSpec& optimizer = recipe.optimizer;
  // The default recipe (neither --optimizer nor --lr): Nesterov SGD, momentum 0.9, lr 0.1
  // for the mlp and the resnet (its batch norms take it) and 0.05 for the cnn, warm-up +
  // cosine over 10 epochs.
  const bool defaultRecipe = !config.optimizer && !config.lr;
  optimizer.name = config.optimizer.value_or("sgd");
  if (optimizer.name == "sgd") {
    const bool mlp = config.model == "mlp" || config.model == "resnet";
    // Without --lr: the default recipe's rates, or the peers' constant-rate recipe's.
    optimizer.lr = config.lr.value_or(defaultRecipe ? (mlp ? 0.1 : 0.05) : (mlp ? 0.05 : 0.02));
    optimizer.momentum = config.momentum.value_or(0.9);
    optimizer.nesterov = config.nesterov || defaultRecipe;
    KOLO_REQUIRE(!config.beta1, "--beta1 applies to --optimizer adam and adamw, not sgd");
  } else {
    optimizer.lr = config.lr.value_or(1e-3);
    KOLO_REQUIRE(!config.momentum && !config.nesterov, "--momentum and --nesterov apply to "
                 "--optimizer sgd only, not ", optimizer.name);
    optimizer.beta1 = config.beta1.value_or(0.9);
    KOLO_REQUIRE(optimizer.beta1 < 1.0, "--beta1 must be in [0, 1), got ", optimizer.beta1);
  }
  optimizer.weightDecay = config.weightDecay.value_or(optimizer.name == "adamw" ? 0.01 : 0.0);
  recipe.epochs = config.epochs.value_or(10);
  optim::ScheduleSpec& schedule = recipe.schedule;
  schedule.name = config.schedule == "auto" ? (config.lr ? "constant" : "warmup-cosine") : config.schedule;
  schedule.lr = optimizer.lr;
  schedule.warmupSteps = config.warmupSteps.value_or(schedule.name == "warmup-cosine" ? stepsPerEpoch / 2 : 0);
  return recipe;
}

std::shared_ptr<nn::Sequential> buildModel(const TrainConfig& config, int begin, int end) {
  Generator gen(config.seed);
  const bool part = config.model == "lm" && (begin > 0 || end >= 0);
  std::shared_ptr<nn::Sequential> model;
  if (config.model == "lm") {
    KOLO_REQUIRE(config.kvHeads == 0 || config.arch == "llama", "--kv-heads applies to --arch llama, not ",
                 config.arch);
    const nn::LanguageModelConfig sizes{.vocab = config.vocab > 0 ? config.vocab : 256,
                                        .layers = config.layers,
                                        .dModel = config.dModel,
                                        .heads = config.heads,
                                        .seqLen = config.seqLen,
                                        .arch = nn::parseLanguageModelArch(config.arch),
                                        .kvHeads = config.kvHeads};
    model = part ? nn::makeLanguageModelPart(sizes, gen, begin, end < 0 ? config.layers + 3 : end)
                 : nn::makeLanguageModel(sizes, gen);
  } else {
    model = nn::makeModel(config.model, gen, config.modelData);
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

std::map<std::string, std::string> runIdentity(const TrainConfig& config) {
  std::map<std::string, std::string> identity = {{"model", config.model},
                                                 {"batch", std::to_string(config.batch)},
                                                 {"seed", std::to_string(config.seed)}};
  if (config.model == "lm") {
    identity["layers"] = std::to_string(config.layers);
    identity["d_model"] = std::to_string(config.dModel);
    identity["seq_len"] = std::to_string(config.seqLen);
    if (config.vocab > 0 && config.vocab != 256) identity["vocab"] = std::to_string(config.vocab);
    if (config.arch != "gpt") {
      identity["arch"] = config.arch;
      identity["kv_heads"] = std::to_string(config.kvHeads > 0 ? config.kvHeads : config.heads);
    }
  }
  // Stored with every checkpoint (a resume over other data is refused).
  if (!config.standardizer.empty()) identity["standardize"] = config.standardizer;
  if (!config.channelNormalization.empty()) identity["normalize"] = config.channelNormalization;
  return identity;
}

void saveWeights(const TrainConfig& config, nn::Module& model, int64_t steps, observe::Logger& logger) {
  if (config.savePath.empty()) return;
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"model", config.model}, {"step", std::to_string(steps)}};
  // The inputs' standardisation (data::Standardizer::toString), which the weights expect.
  if (!config.standardizer.empty()) metadata["standardize"] = config.standardizer;
  // An image folder's per-channel normalisation, likewise.
  if (!config.channelNormalization.empty()) metadata["normalize"] = config.channelNormalization;
  checkpoint::saveSafetensors(config.savePath, model.stateDict(), metadata);
  logger.info("saved weights", {{"file", config.savePath}});
}

}  // namespace kolo::cli
