// Standard layers: PyTorch layouts and default initialisation drawn from a Generator.
#include "kolo/nn/layers.h"

#include <cxxabi.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <typeinfo>
#include <vector>

#include "kolo/autograd.h"
#include "kolo/ops.h"
#include "kolo/trace.h"

namespace kolo::nn {

namespace {
// kaiming_uniform_(a=sqrt(5)) reduces to U(-1/sqrt(fanIn), 1/sqrt(fanIn)), as does the bias.
Tensor uniformInit(const Shape& shape, int64_t fanIn, Generator& gen) {
  const double bound = fanIn > 0 ? 1.0 / std::sqrt(static_cast<double>(fanIn)) : 0.0;
  return Tensor::rand(shape, gen, -bound, bound);
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, Generator& gen, bool withBias) {
  KOLO_REQUIRE(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  weight = registerParameter("weight", uniformInit({out, in}, in, gen));
  if (withBias) bias = registerParameter("bias", uniformInit({out}, in, gen));
}

Linear::Linear(Tensor weight_, Tensor bias_) {
  KOLO_REQUIRE(weight_.defined() && weight_.dim() == 2, "Linear: weight ",
               weight_.defined() ? shapeString(weight_.shape()) : std::string("(undefined)"), " is not [out, in]");
  KOLO_REQUIRE(!bias_.defined() || bias_.shape() == Shape{weight_.shape()[0]}, "Linear: bias ",
               bias_.defined() ? shapeString(bias_.shape()) : std::string(), " does not match weight ",
               shapeString(weight_.shape()));
  weight = registerParameter("weight", std::move(weight_));
  if (bias_.defined()) bias = registerParameter("bias", std::move(bias_));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, Generator& gen, int64_t stride_, int64_t padding_,
               bool withBias)
    : stride(stride_), padding(padding_) {
  KOLO_REQUIRE(in > 0 && out > 0 && kernel > 0, "Conv2d(", in, ", ", out, ", ", kernel,
               "): sizes must be positive");
  const int64_t fanIn = in * kernel * kernel;
  weight = registerParameter("weight", uniformInit({out, in, kernel, kernel}, fanIn, gen));
  if (withBias) bias = registerParameter("bias", uniformInit({out}, fanIn, gen));
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride, padding); }

Tensor MaxPool2d::forward(const Tensor& x) { return maxPool2d(x, kernel_, stride_, padding_); }
Tensor AvgPool2d::forward(const Tensor& x) { return avgPool2d(x, kernel_, stride_, padding_); }
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptiveAvgPool2d(x, outH_, outW_); }

Tensor Flatten::forward(const Tensor& x) { return x.flatten(startDim_, endDim_); }

Tensor Unflatten::forward(const Tensor& x) {
  const int64_t nd = x.dim();
  const int64_t d = dim_ < 0 ? dim_ + nd : dim_;
  KOLO_REQUIRE(d >= 0 && d < nd, "Unflatten: dimension ", dim_, " out of range for input ",
               shapeString(x.shape()));
  KOLO_REQUIRE(shapeNumel(sizes_) == x.shape()[d], "Unflatten: input ", shapeString(x.shape()),
               " dimension ", d, " has ", x.shape()[d], " elements, not ", shapeString(sizes_));
  Shape s(x.shape().begin(), x.shape().begin() + d);
  s.insert(s.end(), sizes_.begin(), sizes_.end());
  s.insert(s.end(), x.shape().begin() + d + 1, x.shape().end());
  return x.reshape(s);
}

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, isTraining(), gen_); }

LayerNorm::LayerNorm(Shape normalizedShape, double eps) : normalizedShape_(std::move(normalizedShape)), eps_(eps) {
  weight = registerParameter("weight", Tensor::ones(normalizedShape_));
  bias = registerParameter("bias", Tensor::zeros(normalizedShape_));
}

Tensor LayerNorm::forward(const Tensor& x) { return layerNorm(x, normalizedShape_, weight, bias, eps_); }

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen) {
  weight = registerParameter("weight", Tensor::randn({num, dim}, gen));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(indices, weight); }

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) add(m);
}

Sequential& Sequential::add(std::shared_ptr<Module> module) {
  registerModule(std::to_string(children().size()), std::move(module));
  return *this;
}

Sequential& Sequential::add(const std::string& name, std::shared_ptr<Module> module) {
  registerModule(name, std::move(module));
  return *this;
}

namespace {

// A module's class without namespaces ("Linear").
std::string className(const Module& module) {
  std::string type = typeid(module).name();
  int status = 0;
  if (char* readable = abi::__cxa_demangle(type.c_str(), nullptr, nullptr, &status)) {
    type = readable;
    std::free(readable);
  }
  const size_t colon = type.rfind("::");
  if (colon != std::string::npos) type = type.substr(colon + 2);
  return type;
}

// "forward 0 Linear": a child's span name in the timeline (its index and class).
std::string childSpanName(const std::string& name, const Module& child) {
  return "forward " + name + " " + className(child);
}

}  // namespace

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  if (recompute_ && ownParameters_.size() != children().size()) {
    // A parameter two children hold (tied embeddings) would get one gradient per child, each
    // from its own recomputed backward: those children run as usual.
    std::map<const TensorImpl*, int> holders;
    for (const auto& [name, child] : children())
      for (const auto& [pname, p] : child->namedParameters()) ++holders[p.impl()];
    ownParameters_.clear();
    for (const auto& [name, child] : children()) {
      bool own = true;
      for (const auto& [pname, p] : child->namedParameters()) own = own && holders[p.impl()] == 1;
      ownParameters_.push_back(own);
    }
  }
  const auto run = [this](size_t i, const Tensor& in) {
    Module& child = *children()[i].second;
    return recompute_ && ownParameters_[i] ? checkpoint(child, in) : child(in);
  };
  if (!trace::enabled()) {
    for (size_t i = 0; i < children().size(); ++i) h = run(i, h);
    return h;
  }
  // The names are made once per child (and kept by the recorder), not on every call.
  if (traceNames_.size() != children().size()) {
    traceNames_.clear();
    for (const auto& [name, child] : children()) traceNames_.push_back(trace::intern(childSpanName(name, *child)));
  }
  for (size_t i = 0; i < children().size(); ++i) {
    trace::Scope span(traceNames_[i], "module");
    span.index(static_cast<int64_t>(i));
    h = run(i, h);
  }
  return h;
}

Tensor Sequential::forwardInputs(const std::vector<Tensor>& inputs) {
  if (children().empty() || inputs.size() == 1) return Module::forwardInputs(inputs);
  // The first child's hooks do not run here: operator() takes a fixed argument list.
  Tensor h = children().front().second->forward(inputs);
  for (size_t i = 1; i < children().size(); ++i) h = (*children()[i].second)(h);
  return h;
}

namespace {

thread_local bool tRecomputing = false;

// While a block is computed again for its backward: recording on, recomputing() true.
class RecomputeScope {
 public:
  RecomputeScope() : gradWas_(autograd::isGradEnabled()) {
    autograd::setGradEnabled(true);
    tRecomputing = true;
  }
  ~RecomputeScope() {
    tRecomputing = false;
    autograd::setGradEnabled(gradWas_);
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool gradWas_;
};

// A few of the output's elements, spread over it: enough to tell a recomputation that drew
// other random numbers from the first forward.
std::vector<double> probe(const Tensor& out) {
  Tensor flat = out.contiguous().reshape({out.numel()}).to(DType::F64);
  const int64_t n = flat.numel(), count = std::min<int64_t>(n, 16);
  std::vector<double> values;
  for (int64_t k = 0; k < count; ++k) values.push_back(flat.data<double>()[k * n / count]);
  return values;
}

}  // namespace

bool recomputing() { return tRecomputing; }

Tensor checkpoint(Module& block, const Tensor& x) {
  std::vector<Tensor> inputs{x};
  for (const Tensor& p : block.parameters()) inputs.push_back(p);
  if (!autograd::needsRecord(inputs)) return block(x);
  Tensor out;
  {
    autograd::NoGradGuard noGrad;
    out = block(x);
  }
  const Tensor saved = x.detach();
  const bool inputNeedsGrad = x.requiresGrad();
  return autograd::record(
      out, inputs, "CheckpointBackward",
      [&block, saved, inputNeedsGrad, first = probe(out), count = inputs.size()](const Tensor& grad) {
        Tensor in = saved.detach();
        if (inputNeedsGrad) in.setRequiresGrad();
        Tensor again;
        {
          RecomputeScope recording;
          again = block(in);
        }
        if (probe(again) != first)
          KOLO_THROW(InvalidArgument, "nn::checkpoint: recomputing ", className(block),
                     " gave another output than its forward: a block computed twice must be "
                     "deterministic (no Dropout in training inside it)");
        // The parameters take their gradients here; only the input's goes on.
        if (again.requiresGrad()) autograd::runBackward(again, grad);
        std::vector<Tensor> grads(count);
        if (inputNeedsGrad) grads[0] = in.grad();
        return grads;
      });
}

}  // namespace kolo::nn
