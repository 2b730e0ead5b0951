// Learning-rate schedules, gradient-norm clipping, and optimizers and schedules by name.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "kolo/error.h"
#include "kolo/optim.h"

namespace kolo::optim {

StepLr::StepLr(double lr, int64_t stepSize, double gamma)
    : lr_(lr), stepSize_(stepSize), gamma_(gamma) {
  KOLO_REQUIRE(stepSize > 0, "StepLr step size must be positive, got ", stepSize);
}

double StepLr::lrAt(int64_t step) const {
  return lr_ * std::pow(gamma_, static_cast<double>(step / stepSize_));
}

CosineLr::CosineLr(double lr, int64_t totalSteps, double minLr)
    : lr_(lr), totalSteps_(totalSteps), minLr_(minLr) {
  KOLO_REQUIRE(totalSteps > 0, "CosineLr total steps must be positive, got ", totalSteps);
}

double CosineLr::lrAt(int64_t step) const {
  if (step >= totalSteps_) return minLr_;
  const double progress =
      static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(totalSteps_);
  return minLr_ + (lr_ - minLr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

WarmupLr::WarmupLr(std::unique_ptr<LrSchedule> after, int64_t warmupSteps, double startFactor)
    : after_(std::move(after)), warmupSteps_(warmupSteps), startFactor_(startFactor) {
  KOLO_REQUIRE(after_ != nullptr, "WarmupLr needs the schedule that follows the warm-up");
  KOLO_REQUIRE(warmupSteps >= 0, "WarmupLr warm-up steps ", warmupSteps, " is negative");
}

double WarmupLr::lrAt(int64_t step) const {
  if (step >= warmupSteps_) return after_->lrAt(step - warmupSteps_);
  const double fraction = static_cast<double>(step + 1) / static_cast<double>(warmupSteps_);
  return after_->lrAt(0) * (startFactor_ + (1.0 - startFactor_) * fraction);
}

double clipGradNorm(const std::vector<Tensor>& parameters, double maxNorm) {
  double sumSquares = 0.0;
  std::vector<Tensor> grads;
  for (const Tensor& parameter : parameters) {
    Tensor grad = parameter.grad();
    if (!grad.defined()) continue;
    KOLO_REQUIRE(grad.dtype() == DType::F32 && grad.isContiguous(),
                 "clipGradNorm needs contiguous f32 gradients (", parameter.name(), " is ",
                 dtypeName(grad.dtype()), ")");
    const float* g = grad.data<float>();
    double partial = 0.0;
    for (int64_t i = 0, n = grad.numel(); i < n; ++i) partial += static_cast<double>(g[i]) * g[i];
    sumSquares += partial;
    grads.push_back(grad);
  }
  const double norm = std::sqrt(sumSquares);
  const double coefficient = maxNorm / (norm + 1e-6);
  if (coefficient < 1.0) {
    const float scale = static_cast<float>(coefficient);
    for (Tensor& grad : grads) {
      float* g = grad.data<float>();
      for (int64_t i = 0, n = grad.numel(); i < n; ++i) g[i] *= scale;
    }
  }
  return norm;
}

std::unique_ptr<Optimizer> makeOptimizer(const OptimizerSpec& spec, NamedParameters parameters) {
  if (spec.name == "sgd")
    return std::make_unique<Sgd>(std::move(parameters), SgdOptions{.lr = spec.lr,
                                                                   .momentum = spec.momentum,
                                                                   .weightDecay = spec.weightDecay,
                                                                   .nesterov = spec.nesterov});
  KOLO_REQUIRE(spec.name == "adam" || spec.name == "adamw", "optimizer '", spec.name,
               "' is not accepted: use sgd, adam or adamw");
  const AdamOptions options{.lr = spec.lr, .beta1 = spec.beta1, .weightDecay = spec.weightDecay};
  if (spec.name == "adamw") return makeAdamW(std::move(parameters), options);
  return std::make_unique<Adam>(std::move(parameters), options);
}

std::unique_ptr<LrSchedule> makeSchedule(const ScheduleSpec& spec, int64_t totalSteps) {
  KOLO_REQUIRE(spec.name == "constant" || spec.name == "cosine" || spec.name == "warmup-cosine" ||
                   spec.name == "step",
               "schedule '", spec.name, "' is not accepted: use constant, cosine, warmup-cosine or step");
  totalSteps = std::max<int64_t>(totalSteps, 1);
  if (spec.name == "constant") return std::make_unique<ConstantLr>(spec.lr);
  if (spec.name == "step") return std::make_unique<StepLr>(spec.lr, std::max<int64_t>(totalSteps / 3, 1), 0.3);
  const int64_t warmup = spec.name == "warmup-cosine" ? std::clamp<int64_t>(spec.warmupSteps, 0, totalSteps) : 0;
  auto cosine = std::make_unique<CosineLr>(spec.lr, std::max<int64_t>(totalSteps - warmup, 1));
  if (warmup == 0) return cosine;
  return std::make_unique<WarmupLr>(std::move(cosine), warmup);
}

}  // namespace kolo::optim
