// kolo::optim: optimizers (SGD, Adam, AdamW) with the exact update rules of torch.optim,
// learning-rate schedules, and gradient-norm clipping. Optimizer state is kept per named
// parameter so it can be checkpointed, restored and later sharded across ranks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::optim {

/// Parameters with their names (a module's namedParameters()).
using NamedParameters = std::vector<std::pair<std::string, Tensor>>;

/// Saved optimizer state: per parameter name, named state tensors (e.g. "momentum_buffer",
/// "exp_avg", "exp_avg_sq"), plus scalars ("step", "lr").
struct StateDict {
  std::map<std::string, std::map<std::string, Tensor>> perParameter;
  std::map<std::string, double> scalars;
  /// The tensors flattened to "<parameter>/<slot>" names (e.g. for a safetensors file).
  std::vector<std::pair<std::string, Tensor>> flatTensors() const;
  /// The inverse of flatTensors(); names without '/' are refused with InvalidArgument.
  static StateDict fromFlat(const std::vector<std::pair<std::string, Tensor>>& tensors,
                            std::map<std::string, double> scalars);
};

/// A gradient as an update reads it: `data[i]`, or, with `other` set,
/// (data[i] + other[i]) * scale. The second form averages two ranks' gradients inside the
/// update loop, so a sharded update reads them once instead of first writing their mean.
struct Gradient {
  const float* data = nullptr;
  const float* other = nullptr;
  float scale = 1.0f;
};

/// The part of one parameter that Optimizer::stepParts() updates: elements [begin, end)
/// of its flat view, with `grad` describing the gradient of exactly those elements.
struct ParameterPart {
  int64_t begin = 0;
  int64_t end = 0;
  Gradient grad;
};

/// Base of every optimizer: holds the parameters (f32 leaves) and per-parameter state.
/// step() updates each parameter whose gradient is defined, in place, with plain loops that
/// never record autograd history.
class Optimizer {
 public:
  Optimizer(NamedParameters parameters, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter with a defined gradient; then stepCount() grows by one.
  /// Throws InvalidArgument naming the parameter if it or its gradient is not contiguous f32.
  void step();
  /// One step over parts of the parameters, for sharded (ZeRO stage 1) updates where each
  /// rank updates its own share of every parameter: parts[i] belongs to parameters()[i].
  /// Elements inside a part change exactly as step() would change them with that gradient;
  /// the others, and their state, are left as they are. Per-parameter scalars (Adam's
  /// step count) advance for every parameter, empty parts included, so ranks that update
  /// different parts keep them equal. Throws InvalidArgument for a part out of range.
  void stepParts(const std::vector<ParameterPart>& parts);
  /// Zeroes every defined gradient (storage kept).
  void zeroGrad();
  double lr() const { return lr_; }
  void setLr(double lr) { lr_ = lr; }
  /// Number of step() calls so far (restored by loadStateDict).
  int64_t stepCount() const { return stepCount_; }
  const NamedParameters& parameters() const { return parameters_; }
  /// Deep copy of the state (tensors cloned), with scalars "step" and "lr".
  virtual StateDict stateDict() const;
  /// Restores state saved by stateDict() of an optimizer of the same kind over parameters
  /// with the same names and shapes; throws InvalidArgument naming any mismatch.
  virtual void loadStateDict(const StateDict& state);
  /// "sgd", "adam", "adamw".
  virtual std::string kind() const = 0;

 protected:
  /// Updates one parameter: `param` and `grad` hold `n` floats; `state` is that parameter's
  /// slot map (empty on its first update); `step` counts from 1.
  virtual void update(const std::string& name, float* param, const Gradient& grad, int64_t n,
                      std::map<std::string, Tensor>& state, int64_t step) = 0;
  /// Names of the state slots this optimizer keeps per parameter.
  virtual std::vector<std::string> slotNames() const = 0;

 private:
  NamedParameters parameters_;
  double lr_;
  int64_t stepCount_ = 0;
  std::map<std::string, std::map<std::string, Tensor>> state_;
};

/// torch.optim.SGD: d = g + wd*p; with momentum, buf = d on the first step and
/// buf = momentum*buf + (1-dampening)*d after; d = nesterov ? d + momentum*buf : buf;
/// p -= lr*d.
struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weightDecay = 0.0;
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  /// Throws InvalidArgument for nesterov without momentum or with dampening (as torch).
  Sgd(NamedParameters parameters, SgdOptions options);
  std::string kind() const override { return "sgd"; }
  const SgdOptions& options() const { return options_; }

 protected:
  void update(const std::string& name, float* param, const Gradient& grad, int64_t n,
              std::map<std::string, Tensor>& state, int64_t step) override;
  std::vector<std::string> slotNames() const override;

 private:
  SgdOptions options_;
};

/// torch.optim.Adam / AdamW (amsgrad off): m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2,
/// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Adam adds wd*p to g first; AdamW
/// (decoupled) multiplies p by (1 - lr*wd) first.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.0;
  bool decoupled = false;  // true: AdamW
};

class Adam : public Optimizer {
 public:
  Adam(NamedParameters parameters, AdamOptions options);
  std::string kind() const override { return options_.decoupled ? "adamw" : "adam"; }
  const AdamOptions& options() const { return options_; }

 protected:
  void update(const std::string& name, float* param, const Gradient& grad, int64_t n,
              std::map<std::string, Tensor>& state, int64_t step) override;
  std::vector<std::string> slotNames() const override;

 private:
  AdamOptions options_;
};

/// AdamW: `options` with decoupled weight decay. The weight decay is options.weightDecay as
/// given (AdamOptions' default is 0; torch's AdamW default, 0.01, is what `kolo train` passes).
std::unique_ptr<Optimizer> makeAdamW(NamedParameters parameters, AdamOptions options);

/// Learning rate as a function of the optimizer step (0-based: lrAt(s) is used by step s).
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lrAt(int64_t step) const = 0;
};

/// Always `lr`.
class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double lrAt(int64_t) const override { return lr_; }

 private:
  double lr_;
};

/// lr * gamma^(floor(step / stepSize)) (torch's StepLR, stepped per optimizer step).
class StepLr : public LrSchedule {
 public:
  StepLr(double lr, int64_t stepSize, double gamma);
  double lrAt(int64_t step) const override;

 private:
  double lr_;
  int64_t stepSize_;
  double gamma_;
};

/// Cosine annealing from lr to minLr over totalSteps: minLr + (lr-minLr)*(1+cos(pi*s/T))/2;
/// minLr after T.
class CosineLr : public LrSchedule {
 public:
  CosineLr(double lr, int64_t totalSteps, double minLr = 0.0);
  double lrAt(int64_t step) const override;

 private:
  double lr_;
  int64_t totalSteps_;
  double minLr_;
};

/// Linear warm-up composed with another schedule: for step < warmupSteps the rate climbs
/// linearly from after.lrAt(0)*startFactor to after.lrAt(0) ((s+1)/W of the way), then
/// follows after.lrAt(step - warmupSteps).
class WarmupLr : public LrSchedule {
 public:
  WarmupLr(std::unique_ptr<LrSchedule> after, int64_t warmupSteps, double startFactor = 0.0);
  double lrAt(int64_t step) const override;

 private:
  std::unique_ptr<LrSchedule> after_;
  int64_t warmupSteps_;
  double startFactor_;
};

/// An optimizer by name, as a configuration or a command line gives it.
struct OptimizerSpec {
  std::string name = "sgd";  // sgd | adam | adamw
  double lr = 0.01;
  double momentum = 0.0;     // sgd
  bool nesterov = false;     // sgd
  double beta1 = 0.9;        // adam, adamw
  double weightDecay = 0.0;  // sgd and adam: added to the gradient; adamw: decoupled
};

/// `spec`'s optimizer over `parameters`. Throws InvalidArgument naming an unknown name or a
/// setting the optimizer does not take (nesterov without momentum).
std::unique_ptr<Optimizer> makeOptimizer(const OptimizerSpec& spec, NamedParameters parameters);

/// A learning-rate schedule by name, for a run whose length is known when it starts.
struct ScheduleSpec {
  std::string name = "constant";  // constant | cosine | warmup-cosine | step
  double lr = 0.01;               // the peak rate
  int64_t warmupSteps = 0;        // warmup-cosine: linear warm-up steps (at most the run)
};

/// `spec`'s schedule over a run of `totalSteps` optimizer steps: constant; cosine from lr to
/// 0 over the run; warmup-cosine, a linear warm-up then cosine over the steps left; step,
/// lr times 0.3 after each third of the run. Throws InvalidArgument naming an unknown name.
std::unique_ptr<LrSchedule> makeSchedule(const ScheduleSpec& spec, int64_t totalSteps);

/// Scales all gradients so that their global L2 norm is at most maxNorm (as
/// torch.nn.utils.clip_grad_norm_: coefficient maxNorm / (norm + 1e-6), capped at 1).
/// Returns the norm before clipping. Parameters without a gradient are skipped.
double clipGradNorm(const std::vector<Tensor>& parameters, double maxNorm);

}  // namespace kolo::optim
