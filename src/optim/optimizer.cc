// Optimizer base (parameter bookkeeping, state save/restore) and the StateDict helpers.
#include <algorithm>
#include <set>

#include "kolo/optim.h"

namespace kolo::optim {

std::vector<std::pair<std::string, Tensor>> StateDict::flatTensors() const {
  std::vector<std::pair<std::string, Tensor>> flat;
  for (const auto& [parameter, slots] : perParameter) {
    for (const auto& [slot, tensor] : slots) flat.emplace_back(parameter + "/" + slot, tensor);
  }
  return flat;
}

StateDict StateDict::fromFlat(const std::vector<std::pair<std::string, Tensor>>& tensors,
                              std::map<std::string, double> scalars) {
  StateDict state;
  state.scalars = std::move(scalars);
  for (const auto& [name, tensor] : tensors) {
    const size_t slash = name.rfind('/');
    KOLO_REQUIRE(slash != std::string::npos && slash > 0 && slash + 1 < name.size(),
                 "optimizer state name '", name, "' is not <parameter>/<slot>");
    state.perParameter[name.substr(0, slash)][name.substr(slash + 1)] = tensor;
  }
  return state;
}

Optimizer::Optimizer(NamedParameters parameters, double lr)
    : parameters_(std::move(parameters)), lr_(lr) {
  std::set<std::string> names;
  for (const auto& [name, parameter] : parameters_) {
    KOLO_REQUIRE(parameter.defined(), "optimizer parameter ", name, " is undefined");
    KOLO_REQUIRE(names.insert(name).second, "optimizer parameter name ", name, " appears twice");
  }
  KOLO_REQUIRE(lr >= 0.0, "learning rate ", lr, " is negative");
}

void Optimizer::step() {
  ++stepCount_;
  for (auto& [name, parameter] : parameters_) {
    Tensor grad = parameter.grad();
    if (!grad.defined()) continue;
    KOLO_REQUIRE(parameter.dtype() == DType::F32 && parameter.isContiguous(),
                 "optimizer parameter ", name, " must be contiguous f32 (is ",
                 dtypeName(parameter.dtype()), ")");
    KOLO_REQUIRE(grad.shape() == parameter.shape(), "gradient of ", name, " has shape ",
                 shapeString(grad.shape()), ", parameter ", shapeString(parameter.shape()));
    Tensor g = grad.dtype() == DType::F32 ? grad.contiguous() : grad.to(DType::F32);
    Tensor p = parameter;
    update(name, p.data<float>(), Gradient{.data = g.data<float>()}, p.numel(), state_[name], stepCount_);
  }
}

void Optimizer::stepParts(const std::vector<ParameterPart>& parts) {
  KOLO_CHECK_EQ(parts.size(), parameters_.size(), "stepParts: one part per parameter");
  ++stepCount_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& [name, parameter] = parameters_[i];
    const ParameterPart& part = parts[i];
    const int64_t numel = parameter.numel();
    KOLO_CHECK(0 <= part.begin && part.begin <= part.end && part.end <= numel,
               "stepParts: part [", part.begin, ", ", part.end, ") of parameter ", name, " with ",
               numel, " elements");
    KOLO_CHECK(part.grad.data != nullptr || part.begin == part.end, "stepParts: part of ", name,
               " has no gradient");
    KOLO_CHECK(parameter.dtype() == DType::F32 && parameter.isContiguous(), "optimizer parameter ",
               name, " must be contiguous f32 (is ", dtypeName(parameter.dtype()), ")");
    // The update sees views of its part of every state tensor; scalars are shared whole.
    std::map<std::string, Tensor>& full = state_[name];
    std::map<std::string, Tensor> window;
    for (const auto& [slot, tensor] : full) {
      window[slot] =
          tensor.dim() == 0 ? tensor : tensor.reshape({numel}).slice(0, part.begin, part.end);
    }
    Tensor p = parameter;
    update(name, p.data<float>() + part.begin, part.grad, part.end - part.begin, window,
           stepCount_);
    // State the update created for its part becomes a whole tensor (zero elsewhere).
    for (auto& [slot, tensor] : window) {
      if (full.count(slot)) continue;
      if (tensor.dim() == 0) {
        full[slot] = tensor;
        continue;
      }
      Tensor whole = Tensor::zeros({numel}, tensor.dtype());
      whole.slice(0, part.begin, part.end).copyFrom(tensor);
      full[slot] = whole;
    }
  }
}

void Optimizer::zeroGrad() {
  for (auto& [name, parameter] : parameters_) {
    Tensor p = parameter;
    p.zeroGrad();
  }
}

StateDict Optimizer::stateDict() const {
  StateDict state;
  for (const auto& [name, slots] : state_) {
    for (const auto& [slot, tensor] : slots) state.perParameter[name][slot] = tensor.clone();
  }
  state.scalars["step"] = static_cast<double>(stepCount_);
  state.scalars["lr"] = lr_;
  return state;
}

void Optimizer::loadStateDict(const StateDict& state) {
  std::map<std::string, const Tensor*> byName;
  for (const auto& [name, parameter] : parameters_) byName[name] = &parameter;
  const std::vector<std::string> slots = slotNames();
  std::map<std::string, std::map<std::string, Tensor>> restored;
  for (const auto& [name, saved] : state.perParameter) {
    auto found = byName.find(name);
    KOLO_REQUIRE(found != byName.end(), "optimizer state names parameter ", name, ", which this ",
                 kind(), " optimizer does not hold");
    for (const auto& [slot, tensor] : saved) {
      KOLO_REQUIRE(std::find(slots.begin(), slots.end(), slot) != slots.end(),
                   "optimizer state slot ", name, "/", slot, " is not one of ", kind(), "'s");
      // A per-element slot comes in the parameter's shape, or flat as update() creates it.
      if (slot != "step") {
        const Tensor& parameter = *found->second;
        KOLO_REQUIRE(tensor.shape() == parameter.shape() ||
                         (tensor.dim() == 1 && tensor.numel() == parameter.numel()),
                     "optimizer state ", name, "/", slot, " has shape ",
                     shapeString(tensor.shape()), ", parameter ", shapeString(parameter.shape()));
      }
      restored[name][slot] = tensor.clone();
    }
  }
  state_ = std::move(restored);
  if (auto it = state.scalars.find("step"); it != state.scalars.end())
    stepCount_ = static_cast<int64_t>(it->second);
  if (auto it = state.scalars.find("lr"); it != state.scalars.end()) lr_ = it->second;
}

}  // namespace kolo::optim
