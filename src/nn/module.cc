// Module bookkeeping: parameter and child registration, recursive naming, modes.
#include "kolo/nn/module.h"

#include "kolo/error.h"

namespace kolo::nn {

Tensor Module::forward(const std::vector<Tensor>& inputs) {
  KOLO_REQUIRE(inputs.size() == 1, "this module takes one input, got ", inputs.size());
  return forward(inputs.front());
}

Tensor Module::registerParameter(const std::string& name, Tensor tensor) {
  KOLO_CHECK(tensor.defined(), "registerParameter('", name, "') with an undefined tensor");
  for (const auto& [existing, t] : parameters_)
    KOLO_CHECK(existing != name, "parameter '", name, "' registered twice");
  tensor.setRequiresGrad(true);
  tensor.setName(name);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

void Module::addChild(const std::string& name, std::shared_ptr<Module> module) {
  KOLO_CHECK(module != nullptr, "registerModule('", name, "') with a null module");
  for (const auto& [existing, m] : children_) KOLO_CHECK(existing != name, "module '", name, "' registered twice");
  module->train(training_);
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::namedParameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : namedParameters()) out.push_back(t);
  return out;
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::zeroGrad() {
  for (auto& [name, t] : namedParameters()) t.zeroGrad();
}

void Module::castParameters(DType dtype) {
  for (auto& [name, t] : namedParameters()) {
    if (t.dtype() == dtype) continue;
    Tensor converted = t.to(dtype);
    TensorImpl* impl = t.impl();
    impl->storage = converted.impl()->storage;
    impl->shape = converted.shape();
    impl->strides = converted.strides();
    impl->offset = converted.storageOffset();
    impl->dtype = dtype;
    impl->autograd.reset();
    t.setRequiresGrad(true);
  }
}

int64_t Module::parameterCount() const {
  int64_t n = 0;
  for (auto& [name, t] : namedParameters()) n += t.numel();
  return n;
}

}  // namespace kolo::nn
