// nn::Module: the base of every layer and model. It owns named parameters and named child
// modules in registration order, so namedParameters() yields PyTorch state_dict names
// ("0.weight", "attn.qkv.bias", ...) in a stable order that optimizers and reducers rely on.
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Computes the module's output; records autograd nodes when parameters require grad.
  virtual Tensor forward(const Tensor& x) = 0;
  /// The output from several inputs (attention's input and mask, for instance). The default
  /// takes exactly one input and calls forward(inputs[0]); modules with more inputs override
  /// it. Throws InvalidArgument naming the count when a module cannot take that many.
  /// A class that overrides only forward(const Tensor&) hides this overload from calls
  /// through its own type: call it through a Module& or with operator().
  virtual Tensor forward(const std::vector<Tensor>& inputs);
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// model(x, mask, ...): forward({x, mask, ...}).
  template <class... More>
    requires(sizeof...(More) > 0 && (std::convertible_to<const More&, const Tensor&> && ...))
  Tensor operator()(const Tensor& x, const More&... more) {
    return forward(std::vector<Tensor>{x, more...});
  }

  /// Every parameter of this module and its children, depth first in registration order,
  /// named as PyTorch's state_dict names them. The tensors are handles to the live
  /// parameters (writing into them changes the model).
  std::vector<std::pair<std::string, Tensor>> namedParameters() const;
  /// The tensors of namedParameters(), same order.
  std::vector<Tensor> parameters() const;
  /// Direct children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  /// Switches training mode (dropout active) for this module and all children.
  void train(bool training = true);
  bool isTraining() const { return training_; }
  /// Zeroes every parameter's gradient in place (keeps the gradient storage).
  void zeroGrad();
  /// Converts every parameter to dtype in place (handles held elsewhere see the change);
  /// e.g. to f64 for gradient checks.
  void castParameters(DType dtype);
  /// Total number of parameter elements.
  int64_t parameterCount() const;

 protected:
  /// Registers a parameter (marked requiresGrad) under `name`; returns the same handle.
  Tensor registerParameter(const std::string& name, Tensor tensor);
  /// Registers a child module under `name`; returns it.
  template <class M>
  std::shared_ptr<M> registerModule(const std::string& name, std::shared_ptr<M> module) {
    addChild(name, module);
    return module;
  }

 private:
  void addChild(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace kolo::nn
