// Module bookkeeping: parameter, buffer and child registration, recursive naming, the
// state dict, modes.
#include "kolo/nn/module.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "kolo/autograd.h"
#include "kolo/error.h"

namespace kolo::nn {

Tensor Module::forwardInputs(const std::vector<Tensor>& inputs) {
  KOLO_REQUIRE(inputs.size() == 1, "this module takes one input, got ", inputs.size());
  return forward(inputs.front());
}

int Module::addForwardPreHook(ForwardPreHook hook) {
  KOLO_REQUIRE(hook != nullptr, "addForwardPreHook with an empty function");
  const int id = nextHookId_++;
  forwardPreHooks_.emplace(id, std::move(hook));
  return id;
}

void Module::removeForwardPreHook(int id) { forwardPreHooks_.erase(id); }

void Module::beforeForward() {
  for (auto& [id, hook] : forwardPreHooks_) hook(*this);
}

int Module::addForwardHook(ForwardHook hook) {
  KOLO_REQUIRE(hook != nullptr, "addForwardHook with an empty function");
  const int id = nextHookId_++;
  forwardHooks_.emplace(id, std::move(hook));
  return id;
}

void Module::removeForwardHook(int id) { forwardHooks_.erase(id); }

int Module::addOutputGradHook(OutputGradHook hook) {
  KOLO_REQUIRE(hook != nullptr, "addOutputGradHook with an empty function");
  const int id = nextHookId_++;
  outputGradHooks_.emplace(id, std::move(hook));
  return id;
}

void Module::removeOutputGradHook(int id) { outputGradHooks_.erase(id); }

int Module::addInputTransform(InputTransform transform) {
  KOLO_REQUIRE(transform != nullptr, "addInputTransform with an empty function");
  const int id = nextHookId_++;
  inputTransforms_.emplace(id, std::move(transform));
  return id;
}

void Module::removeInputTransform(int id) { inputTransforms_.erase(id); }

int Module::addOutputTransform(OutputTransform transform) {
  KOLO_REQUIRE(transform != nullptr, "addOutputTransform with an empty function");
  const int id = nextHookId_++;
  outputTransforms_.emplace(id, std::move(transform));
  return id;
}

void Module::removeOutputTransform(int id) { outputTransforms_.erase(id); }

bool Module::hasHooks() const {
  return !forwardPreHooks_.empty() || !forwardHooks_.empty() || !outputGradHooks_.empty() ||
         !inputTransforms_.empty() || !outputTransforms_.empty();
}

Tensor Module::transformInput(const Tensor& x) {
  if (inputTransforms_.empty()) return x;
  Tensor input = x;
  for (auto& [id, transform] : inputTransforms_) input = transform(*this, input);
  return input;
}

Tensor Module::afterForward(Tensor output) {
  for (auto& [id, transform] : outputTransforms_) output = transform(*this, output);
  for (auto& [id, hook] : forwardHooks_) hook(*this, output);
  if (outputGradHooks_.empty() || !output.requiresGrad() || !autograd::isGradEnabled())
    return output;
  // The identity node holds copies of the hooks registered now, so a hook removed (or a
  // module destroyed) before backward leaves no dangling reference but to the module.
  std::vector<OutputGradHook> hooks;
  for (auto& [id, hook] : outputGradHooks_) hooks.push_back(hook);
  return autograd::record(output.detach(), {output}, "ModuleOutputHook",
                          [this, hooks = std::move(hooks)](const Tensor& grad) {
                            for (const OutputGradHook& hook : hooks) hook(*this, grad);
                            return std::vector<Tensor>{grad};
                          });
}

std::vector<std::pair<std::string, Module*>> Module::namedModules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_) {
    for (auto& [childName, module] : child->namedModules())
      out.emplace_back(childName.empty() ? name : name + "." + childName, module);
  }
  return out;
}

void Module::checkNewName(const std::string& name) const {
  for (const auto& [existing, t] : parameters_)
    KOLO_REQUIRE(existing != name, "'", name, "' is already a parameter");
  for (const auto& [existing, t] : buffers_)
    KOLO_REQUIRE(existing != name, "'", name, "' is already a buffer");
}

Tensor Module::registerParameter(const std::string& name, Tensor tensor) {
  KOLO_REQUIRE(tensor.defined(), "registerParameter('", name, "') with an undefined tensor");
  checkNewName(name);
  tensor.setRequiresGrad(true);
  tensor.setName(name);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::registerBuffer(const std::string& name, Tensor tensor) {
  KOLO_REQUIRE(tensor.defined(), "registerBuffer('", name, "') with an undefined tensor");
  checkNewName(name);
  tensor.setName(name);
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::addChild(const std::string& name, std::shared_ptr<Module> module) {
  KOLO_REQUIRE(module != nullptr, "registerModule('", name, "') with a null module");
  for (const auto& [existing, m] : children_)
    KOLO_REQUIRE(existing != name, "module '", name, "' registered twice");
  module->train(training_);
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, Entries which,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  if (which != Entries::Buffers)
    for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  if (which != Entries::Parameters)
    for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", which, out);
}

std::vector<std::pair<std::string, Tensor>> Module::namedParameters() const {
  std::vector<std::pair<std::string, Tensor>> all, out;
  collect("", Entries::Parameters, all);
  // A tensor shared by two modules (tied embeddings) is one parameter: optimizers, reducers
  // and shards must see it once.
  std::set<const TensorImpl*> seen;
  for (auto& entry : all)
    if (seen.insert(entry.second.impl()).second) out.push_back(std::move(entry));
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : namedParameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::namedBuffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", Entries::Buffers, out);
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : namedBuffers()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::stateDict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", Entries::State, out);
  return out;
}

void Module::loadStateDict(const std::vector<std::pair<std::string, Tensor>>& state,
                           const std::string& source) {
  std::map<std::string, Tensor> given;
  std::vector<std::string> problems;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, t).second) problems.push_back(name + ": given twice");
  }
  std::vector<std::pair<Tensor, Tensor>> copies;
  std::map<std::string, bool> wanted;
  const auto entries = stateDict();
  // A tensor held under two names (tied embeddings) needs only one of them in the state, as
  // PyTorch's safetensors files keep one name of a shared tensor.
  std::set<const TensorImpl*> givenTensors;
  for (const auto& [name, target] : entries)
    if (const auto it = given.find(name); it != given.end() && it->second.defined()) givenTensors.insert(target.impl());
  for (const auto& [name, target] : entries) {
    wanted[name] = true;
    auto it = given.find(name);
    if (it == given.end() || !it->second.defined()) {
      if (!givenTensors.count(target.impl())) problems.push_back(name + ": missing from the " + source);
      continue;
    }
    if (it->second.shape() != target.shape()) {
      problems.push_back(name + ": state has " + shapeString(it->second.shape()) +
                         ", module expects " + shapeString(target.shape()));
      continue;
    }
    copies.emplace_back(target, it->second);
  }
  for (const auto& [name, t] : state)
    if (!wanted.count(name)) problems.push_back(name + ": in the " + source + " but not in the module");
  if (!problems.empty()) {
    std::string message = "cannot load " + source + ":";
    for (const std::string& problem : problems) message += "\n  " + problem;
    KOLO_THROW(InvalidArgument, message);
  }
  for (auto& [target, value] : copies) {
    Tensor destination = target;
    destination.copyFrom(value);
  }
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::zeroGrad() {
  for (auto& [name, t] : namedParameters()) t.zeroGrad();
}

namespace {
// Gives the tensor behind `t` dtype's storage, so every handle to it sees the conversion.
void convertInPlace(Tensor& t, DType dtype) {
  Tensor converted = t.to(dtype);
  TensorImpl* impl = t.impl();
  impl->storage = converted.impl()->storage;
  impl->shape = converted.shape();
  impl->strides = converted.strides();
  impl->offset = converted.storageOffset();
  impl->dtype = dtype;
  impl->autograd.reset();
}

bool isFloating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::F16 || dtype == DType::BF16;
}
}  // namespace

void Module::castParameters(DType dtype) {
  for (auto& [name, t] : namedParameters()) {
    if (t.dtype() == dtype) continue;
    convertInPlace(t, dtype);
    t.setRequiresGrad(true);
  }
  for (auto& [name, t] : namedBuffers())
    if (t.dtype() != dtype && isFloating(t.dtype())) convertInPlace(t, dtype);
}

int64_t Module::parameterCount() const {
  int64_t n = 0;
  for (auto& [name, t] : namedParameters()) n += t.numel();
  return n;
}

double maxRelativeDifference(const Module& a, const Module& b) {
  const auto left = a.stateDict();
  const auto right = b.stateDict();
  KOLO_REQUIRE(left.size() == right.size(), "maxRelativeDifference: the modules hold ", left.size(), " and ",
               right.size(), " tensors");
  double worst = 0.0;
  for (size_t t = 0; t < left.size(); ++t) {
    const auto& [name, x] = left[t];
    const auto& [otherName, y] = right[t];
    KOLO_REQUIRE(name == otherName && x.shape() == y.shape(), "maxRelativeDifference: tensor ", t, " is '", name,
                 "' ", shapeString(x.shape()), " against '", otherName, "' ", shapeString(y.shape()));
    const std::vector<double> xs = x.toDoubleVector(), ys = y.toDoubleVector();
    double diff = 0.0, scale = 1e-12;
    for (size_t i = 0; i < xs.size(); ++i) {
      diff = std::max(diff, std::fabs(xs[i] - ys[i]));
      scale = std::max(scale, std::fabs(ys[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace kolo::nn
