// TrainChecks: the test-only injections of --detect-anomaly and --check-sync.
#include "cli/train_checks.h"

#include <vector>

#include "kolo/autograd.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

std::vector<std::string> splitColons(const std::string& text) {
  std::vector<std::string> parts;
  size_t from = 0;
  while (true) {
    const size_t colon = text.find(':', from);
    parts.push_back(text.substr(from, colon - from));
    if (colon == std::string::npos) return parts;
    from = colon + 1;
  }
}

int64_t parseWhole(const std::string& text, const std::string& flag, const std::string& value,
                   const char* form) {
  size_t used = 0;
  int64_t number = -1;
  try {
    number = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KOLO_REQUIRE(used == text.size() && !text.empty() && number >= 0, flag, " '", value,
               "' is not accepted: use ", form);
  return number;
}

}  // namespace

TrainChecks::TrainChecks(const TrainConfig& config, nn::Module& model, int rank,
                         bool parameterGradients)
    : model_(model), rank_(rank) {
  // Central storage trains replicas whose forward the central model never runs.
  KOLO_REQUIRE(!(config.detectAnomaly || !config.debugNanAt.empty()) ||
                   config.strategy != "central-storage",
               "--detect-anomaly watches the modules that run forward: use it with one-device, "
               "mirrored (replica 0) or multi-worker-mirrored, not central-storage");
  if (config.detectAnomaly || !config.debugNanAt.empty()) {
    detector_ = std::make_shared<observe::AnomalyDetector>(
        model, observe::AnomalyOptions{.parameterGradients = parameterGradients, .rank = rank});
  }
  if (!config.debugNanAt.empty()) {
    const char* form = "STEP:RANK:MODULE or STEP:RANK:MODULE:grad, e.g. 5:1:2";
    const std::vector<std::string> parts = splitColons(config.debugNanAt);
    KOLO_REQUIRE(parts.size() == 3 || (parts.size() == 4 && parts[3] == "grad"),
                 "--debug-nan-at '", config.debugNanAt, "' is not accepted: use ", form);
    const int64_t step = parseWhole(parts[0], "--debug-nan-at", config.debugNanAt, form);
    const int64_t onRank = parseWhole(parts[1], "--debug-nan-at", config.debugNanAt, form);
    if (onRank == rank) {
      detector_->injectNan(step, parts[2],
                           parts.size() == 4 ? observe::AnomalyPhase::OutputGradient
                                             : observe::AnomalyPhase::ForwardOutput);
    }
  }
  if (!config.debugPerturb.empty()) {
    const char* form = "STEP:RANK:TENSOR, e.g. 3:1:0.weight";
    const std::vector<std::string> parts = splitColons(config.debugPerturb);
    KOLO_REQUIRE(parts.size() == 3, "--debug-perturb '", config.debugPerturb,
                 "' is not accepted: use ", form);
    perturbStep_ = parseWhole(parts[0], "--debug-perturb", config.debugPerturb, form);
    perturbRank_ = static_cast<int>(parseWhole(parts[1], "--debug-perturb", config.debugPerturb, form));
    perturbTensor_ = parts[2];
    std::string names;
    bool known = false;
    for (const auto& [name, tensor] : model.stateDict()) {
      known = known || name == perturbTensor_;
      names += (names.empty() ? "" : ", ") + name;
    }
    KOLO_REQUIRE(known, "--debug-perturb: the model has no tensor '", perturbTensor_,
                 "'; it has ", names);
  }
}

TrainChecks::~TrainChecks() = default;

void TrainChecks::beforeStep(int64_t step) {
  if (step != perturbStep_ || rank_ != perturbRank_) return;
  // A change by hand that data parallelism cannot undo: every rank applies the same
  // averaged update, so the difference stays.
  autograd::NoGradGuard noGrad;
  for (auto& [name, tensor] : model_.stateDict()) {
    if (name != perturbTensor_) continue;
    Tensor shifted = tensor.clone();
    shifted.data<float>()[0] += 1e-3f;
    tensor.copyFrom(shifted);
  }
}

}  // namespace kolo::cli
