// Standard layers with PyTorch's weight layouts and default initialisation:
// Linear [out, in], Conv2d [out, in, kh, kw], LayerNorm, Embedding, activations, pooling
// (max, average, adaptive average), shape adapters, dropout and Sequential (children named
// "0", "1", ... or by the caller). Batch norm: kolo/nn/batch_norm.h.
#pragma once

#include <initializer_list>

#include "kolo/nn/batch_norm.h"
#include "kolo/nn/module.h"

namespace kolo::nn {

/// y = x W^T + b. Weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform(a=sqrt(5))).
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, Generator& gen, bool bias = true);
  /// A layer over given tensors, weight [out, in] and bias [out] (may be undefined), registered
  /// as its parameters. A tensor that another module already holds is then shared (tied input
  /// and output embeddings): Module::namedParameters() lists it once.
  explicit Linear(Tensor weight, Tensor bias = Tensor());
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

/// 2-d convolution (square stride and padding); init bound 1/sqrt(in * kh * kw).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, Generator& gen, int64_t stride = 1, int64_t padding = 0,
         bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t stride, padding;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0)
      : kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t kernel_, stride_, padding_;
};

/// Average pooling (torch.nn.AvgPool2d: the padding counts in the divisor); stride defaults
/// to the kernel size.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0)
      : kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t kernel_, stride_, padding_;
};

/// Adaptive average pooling to an outH x outW grid (torch.nn.AdaptiveAvgPool2d's bins);
/// AdaptiveAvgPool2d(1) is the global average of each channel.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t outH, int64_t outW = -1) : outH_(outH), outW_(outW < 0 ? outH : outW) {
    KOLO_REQUIRE(outH_ > 0 && outW_ > 0, "AdaptiveAvgPool2d(", outH, ", ", outW, "): sizes must be positive");
  }
  Tensor forward(const Tensor& x) override;

 private:
  int64_t outH_, outW_;
};

/// Flattens dimensions startDim..endDim (PyTorch nn.Flatten defaults: 1..-1).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t startDim = 1, int64_t endDim = -1) : startDim_(startDim), endDim_(endDim) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t startDim_, endDim_;
};

/// Splits dimension dim into `sizes` (nn.Unflatten).
class Unflatten : public Module {
 public:
  Unflatten(int64_t dim, Shape sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t dim_;
  Shape sizes_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// Inverted dropout with its own seeded generator; identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, uint64_t seed = 0) : p_(p), gen_(seed) {}
  Tensor forward(const Tensor& x) override;

 private:
  double p_;
  Generator gen_;
};

/// Layer normalisation over the trailing `normalizedShape`; weight ones, bias zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalizedShape, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  const Shape& normalizedShape() const { return normalizedShape_; }
  double eps() const { return eps_; }
  Tensor weight, bias;

 private:
  Shape normalizedShape_;
  double eps_;
};

/// Lookup table [num, dim] initialised N(0, 1); forward takes integer indices.
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator& gen);
  Tensor forward(const Tensor& indices) override;
  Tensor weight;
};

/// Runs children in order; children are named "0", "1", ... as in torch.nn.Sequential,
/// or as the caller names them.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  /// Appends a module (named by its index); returns *this for chaining.
  Sequential& add(std::shared_ptr<Module> module);
  /// Appends a module under `name` (torch's Sequential(OrderedDict(...))), so that its
  /// entries are "name.weight", ...; returns *this. Throws InvalidArgument for a name taken.
  Sequential& add(const std::string& name, std::shared_ptr<Module> module);
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  size_t size() const { return children().size(); }
  Module& at(size_t i) const { return *children().at(i).second; }
  /// Activation checkpointing per child: forward keeps only each child's input and backward
  /// computes the child again before its gradient (nn::checkpoint). Trades one more forward
  /// per step for the activations inside the children; the numbers do not change. A child
  /// that shares a parameter with another child (tied embeddings) runs as usual, since
  /// nn::checkpoint needs a block whose parameters are its own.
  void setRecompute(bool recompute) { recompute_ = recompute; }
  bool recompute() const { return recompute_; }

 protected:
  /// Gives every input to the first child and its output alone to the rest (a first layer
  /// that takes a mask, for instance).
  Tensor forwardInputs(const std::vector<Tensor>& inputs) override;

 private:
  std::vector<const char*> traceNames_;  // the children's timeline span names, made on first use
  bool recompute_ = false;
  std::vector<bool> ownParameters_;  // under recompute: children sharing no parameter, on first use
};

/// Activation checkpointing (torch.utils.checkpoint) of `block` on `x`: block(x) runs without
/// recording, so that only x is kept for backward; backward runs block(x) again, recording,
/// and backpropagates through it, the block's parameters accumulating their gradients (and
/// firing their gradient-ready hooks) then. Equals block(x) and its gradients exactly. The
/// block must compute the same output both times and must not share a parameter with what
/// lies outside it: recomputing it with a random layer inside (Dropout in training) throws
/// InvalidArgument from backward, naming the block. A BatchNorm inside updates its running
/// statistics twice. Without grad mode, or with nothing that requires grad, it is block(x).
Tensor checkpoint(Module& block, const Tensor& x);

/// True on this thread while nn::checkpoint computes a block again for its backward (module
/// hooks that prefetch or free weights for the forward pass skip that then: fsdp).
bool recomputing();

}  // namespace kolo::nn
