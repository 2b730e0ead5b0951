// SGD and Adam/AdamW updates, written as plain loops over f32 that the compiler
// vectorises, following torch.optim's single-tensor code path operation by operation.
#include <cmath>

#include "kolo/optim.h"

namespace kolo::optim {
namespace {

// The update loops, compiled for AVX-512 and AVX2 as well as the baseline and picked at
// load time. Every operation is elementwise and none is fused into an FMA, so each width
// gives the same floats. Each loop is written once over a gradient accessor and
// instantiated for a plain gradient and for the mean of two (Gradient::other).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KOLO_OPTIM_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
#define KOLO_OPTIM_BODY __attribute__((always_inline, optimize("fp-contract=off"))) inline
#else
#define KOLO_OPTIM_CLONES
#define KOLO_OPTIM_BODY inline
#endif

struct Plain {
  const float* __restrict g;
  KOLO_OPTIM_BODY float operator[](int64_t i) const { return g[i]; }
};

struct MeanOfTwo {
  const float* __restrict a;
  const float* __restrict b;
  float scale;
  KOLO_OPTIM_BODY float operator[](int64_t i) const { return (a[i] + b[i]) * scale; }
};

template <class G>
KOLO_OPTIM_BODY void sgdPlainLoop(float* __restrict param, G grad, int64_t n, float lr, float wd) {
  for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
}

template <class G>
KOLO_OPTIM_BODY void sgdMomentumLoop(float* __restrict param, G grad, float* __restrict buf,
                                     int64_t n, float lr, float wd, float momentum, float keep,
                                     bool nesterov) {
  if (nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      const float d = grad[i] + wd * param[i];
      buf[i] = momentum * buf[i] + keep * d;
      param[i] -= lr * (d + momentum * buf[i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float d = grad[i] + wd * param[i];
      buf[i] = momentum * buf[i] + keep * d;
      param[i] -= lr * buf[i];
    }
  }
}

template <class G>
KOLO_OPTIM_BODY void adamLoop(float* __restrict param, G grad, float* __restrict m,
                              float* __restrict v, int64_t n, float beta1, float beta2,
                              float oneMinusBeta1, float oneMinusBeta2, float eps,
                              float coupledWd, float shrink, float stepSize,
                              float correction2Sqrt) {
  for (int64_t i = 0; i < n; ++i) {
    // AdamW's decay first (torch: param.mul_(1 - lr * wd)), in the same pass; Adam's shrink
    // is 1, which leaves the parameter as it is.
    const float p = param[i] * shrink;
    const float g = grad[i] + coupledWd * p;
    m[i] = m[i] * beta1 + g * oneMinusBeta1;
    v[i] = v[i] * beta2 + g * g * oneMinusBeta2;
    const float denom = std::sqrt(v[i]) / correction2Sqrt + eps;
    param[i] = p - stepSize * (m[i] / denom);
  }
}

KOLO_OPTIM_CLONES void sgdPlain(float* param, const Gradient& grad, int64_t n, float lr, float wd) {
  if (grad.other != nullptr) {
    sgdPlainLoop(param, MeanOfTwo{grad.data, grad.other, grad.scale}, n, lr, wd);
  } else {
    sgdPlainLoop(param, Plain{grad.data}, n, lr, wd);
  }
}

KOLO_OPTIM_CLONES void sgdMomentum(float* param, const Gradient& grad, float* buf, int64_t n,
                                   float lr, float wd, float momentum, float keep, bool nesterov) {
  if (grad.other != nullptr) {
    sgdMomentumLoop(param, MeanOfTwo{grad.data, grad.other, grad.scale}, buf, n, lr, wd, momentum,
                    keep, nesterov);
  } else {
    sgdMomentumLoop(param, Plain{grad.data}, buf, n, lr, wd, momentum, keep, nesterov);
  }
}

KOLO_OPTIM_CLONES void adamMoments(float* param, const Gradient& grad, float* m, float* v,
                                   int64_t n, float beta1, float beta2, float oneMinusBeta1,
                                   float oneMinusBeta2, float eps, float coupledWd,
                                   float shrink, float stepSize, float correction2Sqrt) {
  if (grad.other != nullptr) {
    adamLoop(param, MeanOfTwo{grad.data, grad.other, grad.scale}, m, v, n, beta1, beta2,
             oneMinusBeta1, oneMinusBeta2, eps, coupledWd, shrink, stepSize, correction2Sqrt);
  } else {
    adamLoop(param, Plain{grad.data}, m, v, n, beta1, beta2, oneMinusBeta1, oneMinusBeta2, eps,
             coupledWd, shrink, stepSize, correction2Sqrt);
  }
}

// The gradient's element i (the first step's buffer, outside the hot loops).
float gradientAt(const Gradient& grad, int64_t i) {
  return grad.other != nullptr ? MeanOfTwo{grad.data, grad.other, grad.scale}[i] : grad.data[i];
}

}  // namespace

Sgd::Sgd(NamedParameters parameters, SgdOptions options)
    : Optimizer(std::move(parameters), options.lr), options_(options) {
  KOLO_REQUIRE(options.momentum >= 0.0, "SGD momentum ", options.momentum, " is negative");
  KOLO_REQUIRE(options.weightDecay >= 0.0, "SGD weight decay ", options.weightDecay,
               " is negative");
  KOLO_REQUIRE(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0),
               "Nesterov momentum requires a momentum and zero dampening");
}

std::vector<std::string> Sgd::slotNames() const { return {"momentum_buffer"}; }

void Sgd::update(const std::string& name, float* param, const Gradient& grad, int64_t n,
                 std::map<std::string, Tensor>& state, int64_t) {
  const float lr = static_cast<float>(this->lr());
  const float wd = static_cast<float>(options_.weightDecay);
  const float momentum = static_cast<float>(options_.momentum);
  const float keep = static_cast<float>(1.0 - options_.dampening);
  if (momentum == 0.0f) {
    sgdPlain(param, grad, n, lr, wd);
    return;
  }
  auto found = state.find("momentum_buffer");
  if (found == state.end()) {
    // First step: the buffer is the (decayed) gradient itself, without dampening.
    Tensor buffer = Tensor::empty({n}, DType::F32);
    float* buf = buffer.data<float>();
    for (int64_t i = 0; i < n; ++i) buf[i] = gradientAt(grad, i) + wd * param[i];
    for (int64_t i = 0; i < n; ++i) {
      const float d = options_.nesterov ? buf[i] + momentum * buf[i] : buf[i];
      param[i] -= lr * d;
    }
    state["momentum_buffer"] = buffer;
    return;
  }
  float* buf = found->second.data<float>();
  KOLO_CHECK_EQ(found->second.numel(), n, "momentum buffer of ", name);
  sgdMomentum(param, grad, buf, n, lr, wd, momentum, keep, options_.nesterov);
}

Adam::Adam(NamedParameters parameters, AdamOptions options)
    : Optimizer(std::move(parameters), options.lr), options_(options) {
  KOLO_REQUIRE(options.beta1 >= 0.0 && options.beta1 < 1.0, "Adam beta1 ", options.beta1,
               " not in [0, 1)");
  KOLO_REQUIRE(options.beta2 >= 0.0 && options.beta2 < 1.0, "Adam beta2 ", options.beta2,
               " not in [0, 1)");
  KOLO_REQUIRE(options.eps >= 0.0, "Adam eps ", options.eps, " is negative");
  KOLO_REQUIRE(options.weightDecay >= 0.0, "Adam weight decay ", options.weightDecay,
               " is negative");
}

std::vector<std::string> Adam::slotNames() const { return {"exp_avg", "exp_avg_sq", "step"}; }

void Adam::update(const std::string& name, float* param, const Gradient& grad, int64_t n,
                  std::map<std::string, Tensor>& state, int64_t) {
  if (!state.count("exp_avg")) {
    state["exp_avg"] = Tensor::zeros({n}, DType::F32);
    state["exp_avg_sq"] = Tensor::zeros({n}, DType::F32);
    state["step"] = Tensor::zeros({}, DType::F64);
  }
  Tensor& stepTensor = state["step"];
  // The step count is per parameter (as in torch): a parameter that missed an update keeps
  // its own bias correction.
  const double step = stepTensor.item() + 1.0;
  stepTensor.fill(step);
  float* m = state["exp_avg"].data<float>();
  float* v = state["exp_avg_sq"].data<float>();
  KOLO_CHECK_EQ(state["exp_avg"].numel(), n, "Adam state of ", name);
  const double lr = this->lr();
  const float beta1 = static_cast<float>(options_.beta1);
  const float beta2 = static_cast<float>(options_.beta2);
  const float oneMinusBeta1 = static_cast<float>(1.0 - options_.beta1);
  const float oneMinusBeta2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  const float wd = static_cast<float>(options_.weightDecay);
  const double biasCorrection1 = 1.0 - std::pow(options_.beta1, step);
  const double biasCorrection2 = 1.0 - std::pow(options_.beta2, step);
  const float stepSize = static_cast<float>(lr / biasCorrection1);
  const float correction2Sqrt = static_cast<float>(std::sqrt(biasCorrection2));
  const float shrink =
      options_.decoupled && wd != 0.0f ? static_cast<float>(1.0 - lr * options_.weightDecay) : 1.0f;
  const float coupledWd = options_.decoupled ? 0.0f : wd;
  adamMoments(param, grad, m, v, n, beta1, beta2, oneMinusBeta1, oneMinusBeta2, eps, coupledWd,
              shrink, stepSize, correction2Sqrt);
}

std::unique_ptr<Optimizer> makeAdamW(NamedParameters parameters, AdamOptions options) {
  options.decoupled = true;
  return std::make_unique<Adam>(std::move(parameters), options);
}

}  // namespace kolo::optim
