// nn::Module: the base of every layer and model. It owns named parameters, named buffers
// (state that is saved and synchronised but not trained, such as running statistics) and
// named child modules in registration order, so namedParameters() and stateDict() yield
// PyTorch state_dict names ("0.weight", "attn.qkv.bias", "bn.running_mean", ...) in a stable
// order that optimizers, reducers and saved files rely on.
#pragma once

#include <concepts>
#include <functional>
#include <map>
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
  /// The output from several inputs (attention's input and mask, for instance): calls
  /// forwardInputs(), which modules with more than one input override. Throws
  /// InvalidArgument naming the count when a module cannot take that many. (A class that
  /// declares its own forward hides this overload unless it says `using Module::forward;`;
  /// operator() always reaches it.)
  Tensor forward(const std::vector<Tensor>& inputs) { return forwardInputs(inputs); }
  /// forward(x), then this module's hooks (addForwardHook, addOutputGradHook). Containers
  /// (Sequential) call their children this way; like PyTorch's hooks, which run from
  /// __call__, they do not fire when forward() is called directly.
  Tensor operator()(const Tensor& x) {
    beforeForward();
    return afterForward(forward(transformInput(x)));
  }
  /// model(x, mask, ...): forward({x, mask, ...}), then the hooks.
  template <class... More>
    requires(sizeof...(More) > 0 && (std::convertible_to<const More&, const Tensor&> && ...))
  Tensor operator()(const Tensor& x, const More&... more) {
    beforeForward();
    return afterForward(forwardInputs(std::vector<Tensor>{transformInput(x), more...}));
  }

  /// Called with the module before each forward reached through operator().
  using ForwardPreHook = std::function<void(Module& module)>;
  /// Registers `hook` (PyTorch's register_forward_pre_hook); returns an id for
  /// removeForwardPreHook. Hooks run in registration order, on the thread that runs forward.
  int addForwardPreHook(ForwardPreHook hook);
  void removeForwardPreHook(int id);
  /// Called with the module and its output after each forward reached through operator().
  using ForwardHook = std::function<void(Module& module, const Tensor& output)>;
  /// Called during backward with the module and the gradient of its output.
  using OutputGradHook = std::function<void(Module& module, const Tensor& gradOutput)>;
  /// Registers `hook` (PyTorch's register_forward_hook); returns an id for removeForwardHook.
  /// Hooks run in registration order, on the thread that runs forward. A hook may write into
  /// the output (tests inject values that way) but must not keep it beyond the call.
  int addForwardHook(ForwardHook hook);
  void removeForwardHook(int id);
  /// Registers `hook` on the gradient of this module's output (PyTorch's
  /// register_full_backward_hook, output side): each forward through operator() that records
  /// autograd passes its output through an identity node whose backward calls the hooks, in
  /// registration order, on the thread that runs backward. Returns an id for
  /// removeOutputGradHook. Hooks present at forward time are the ones that fire.
  int addOutputGradHook(OutputGradHook hook);
  void removeOutputGradHook(int id);
  /// Replaces the (first) input of each forward reached through operator(), after the
  /// forward pre-hooks: forward sees transform(module, x). What PyTorch's forward pre-hooks
  /// do when they return a value; tensor parallelism enters its regions this way (an
  /// all-reduce of the input's gradient backward, say). Transforms run in registration
  /// order. Returns an id for removeInputTransform.
  using InputTransform = std::function<Tensor(Module& module, const Tensor& input)>;
  int addInputTransform(InputTransform transform);
  void removeInputTransform(int id);
  /// Replaces the output of each forward reached through operator(), before the forward
  /// hooks see it (PyTorch's forward hooks that return a value; tensor parallelism leaves
  /// its regions this way). Registration order. Returns an id for removeOutputTransform.
  using OutputTransform = std::function<Tensor(Module& module, const Tensor& output)>;
  int addOutputTransform(OutputTransform transform);
  void removeOutputTransform(int id);
  /// Whether any hook or transform is registered on this module: a parent that would run
  /// it by a fused path of its own (TransformerBlock's mlp) calls it through operator()
  /// then.
  bool hasHooks() const;
  /// Every module of the tree, this one first (named ""), then its children depth first in
  /// registration order, named as in namedParameters() ("0", "attn.qkv").
  std::vector<std::pair<std::string, Module*>> namedModules();

  /// Every parameter of this module and its children, depth first in registration order,
  /// named as PyTorch's state_dict names them. The tensors are handles to the live
  /// parameters (writing into them changes the model). A tensor registered by two modules
  /// (tied embeddings) is listed once, under its first name, as PyTorch's named_parameters()
  /// does; stateDict() holds it under both.
  std::vector<std::pair<std::string, Tensor>> namedParameters() const;
  /// The tensors of namedParameters(), same order.
  std::vector<Tensor> parameters() const;
  /// Every buffer of this module and its children, depth first in registration order, with
  /// state_dict names ("bn.running_mean"). Handles to the live buffers.
  std::vector<std::pair<std::string, Tensor>> namedBuffers() const;
  /// The tensors of namedBuffers(), same order.
  std::vector<Tensor> buffers() const;
  /// Parameters and buffers in PyTorch's state_dict order: a module's parameters, then its
  /// buffers, then its children's entries. Handles to the live tensors (clone() them for a
  /// snapshot).
  std::vector<std::pair<std::string, Tensor>> stateDict() const;
  /// Copies `state` into the parameters and buffers by name, converting to their dtypes.
  /// Every name of stateDict() must be present with its shape (of a tensor held under two
  /// names, one is enough), and `state` may hold no other name; otherwise throws
  /// InvalidArgument listing each missing, unexpected or mis-shaped name ("0.weight: state
  /// has [512, 784], module expects [256, 784]") after "cannot load <source>:". Nothing is
  /// copied unless every check passes.
  void loadStateDict(const std::vector<std::pair<std::string, Tensor>>& state,
                     const std::string& source = "state dict");
  /// Direct children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  /// Switches training mode (dropout active) for this module and all children.
  void train(bool training = true);
  bool isTraining() const { return training_; }
  /// Zeroes every parameter's gradient in place (keeps the gradient storage).
  void zeroGrad();
  /// Converts every parameter and every floating-point buffer to dtype in place (handles
  /// held elsewhere see the change); e.g. to f64 for gradient checks.
  void castParameters(DType dtype);
  /// Total number of parameter elements.
  int64_t parameterCount() const;

 protected:
  /// forward() of several inputs. The default takes exactly one and calls forward(inputs[0]).
  /// A separate name from forward, so that a module overriding forward(const Tensor&) alone
  /// hides no virtual function (-Woverloaded-virtual).
  virtual Tensor forwardInputs(const std::vector<Tensor>& inputs);
  /// Registers a parameter (marked requiresGrad) under `name`; returns the same handle.
  Tensor registerParameter(const std::string& name, Tensor tensor);
  /// Registers a buffer (torch's register_buffer): saved in stateDict(), broadcast by data
  /// parallelism, never trained (requiresGrad false). Returns the same handle; a layer
  /// updates it in place (copyFrom) so that handles held by reducers and replicas stay valid.
  Tensor registerBuffer(const std::string& name, Tensor tensor);
  /// Registers a child module under `name`; returns it.
  template <class M>
  std::shared_ptr<M> registerModule(const std::string& name, std::shared_ptr<M> module) {
    addChild(name, module);
    return module;
  }

 private:
  void addChild(const std::string& name, std::shared_ptr<Module> module);
  /// Runs the forward pre-hooks.
  void beforeForward();
  /// x through the input transforms.
  Tensor transformInput(const Tensor& x);
  /// Runs the output transforms, then the forward hooks on `output` and, when there are output-gradient hooks and
  /// autograd records, returns it through their identity node; otherwise returns it.
  Tensor afterForward(Tensor output);
  enum class Entries { Parameters, Buffers, State };
  void collect(const std::string& prefix, Entries which,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  void checkNewName(const std::string& name) const;

  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::map<int, ForwardPreHook> forwardPreHooks_;
  std::map<int, ForwardHook> forwardHooks_;
  std::map<int, OutputGradHook> outputGradHooks_;
  std::map<int, InputTransform> inputTransforms_;
  std::map<int, OutputTransform> outputTransforms_;
  int nextHookId_ = 0;
};

/// How far the weights of `a` are from those of `b`, two modules of one architecture (a model
/// trained distributed against the same trained on one device, say): over the tensors of
/// their stateDict()s, the largest max |a - b| / max |b| of any tensor (max |b| taken as at
/// least 1e-12). Throws InvalidArgument naming the first tensor whose name or shape differs,
/// or when the two hold different numbers of tensors.
double maxRelativeDifference(const Module& a, const Module& b);

}  // namespace kolo::nn
