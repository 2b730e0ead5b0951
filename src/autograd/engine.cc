// The backward engine: counts each node's dependencies before the pass, runs nodes as their
// gradients become complete (accumulators first, then latest-created), and fires a leaf's
// gradient-ready hooks the moment its accumulator has run, while backward continues. The
// gradients that reach one node by several paths are summed in place where the pending buffer
// is the only handle on its memory, into a new tensor otherwise.
#include <queue>
#include <unordered_map>

#include "autograd/sole_owner.h"
#include "kolo/autograd.h"
#include "tensor/autograd_hooks.h"
#include "tensor/kernels.h"

namespace kolo::autograd {

namespace {

thread_local bool tGradEnabled = true;
thread_local uint64_t tNextSequence = 1;

/// A node whose backward is a closure over the saved tensors of its op.
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(const Tensor& gradOutput) override { return fn_(gradOutput); }
  std::string name() const override { return name_; }

 private:
  const char* name_;
  BackwardFn fn_;
};

/// Accumulates the incoming gradient into a leaf's .grad and fires its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  bool isAccumulator() const override { return true; }
  std::string name() const override { return "AccumulateGrad"; }

  std::vector<Tensor> apply(const Tensor& gradOutput) override {
    std::shared_ptr<TensorImpl> impl = leaf_.lock();
    if (!impl || !gradOutput.defined()) return {};
    Tensor leaf(impl);
    AutogradMeta& meta = *impl->autograd;
    Tensor g = gradOutput;
    if (g.shape() != leaf.shape()) g = kernels::sumToShape(g, leaf.shape());
    if (meta.gradIsZero && meta.grad.dtype() == g.dtype()) {
      kernels::copyInto(meta.grad, g);
      meta.gradIsZero = false;
    } else if (!meta.grad.defined() || meta.gradIsZero) {
      meta.gradIsZero = false;
      // Steal the incoming buffer when nothing else references it; otherwise copy so that
      // later in-place accumulation cannot write into another tensor.
      if (g.dtype() == leaf.dtype() && g.isContiguous() && g.impl()->storage.use_count() == 1 &&
          g.storageOffset() == 0 && g.implPtr().use_count() <= 2) {
        meta.grad = Tensor(std::make_shared<TensorImpl>(*g.impl()));
      } else {
        meta.grad = Tensor::empty(leaf.shape(), leaf.dtype());
        kernels::copyInto(meta.grad, g);
      }
    } else {
      kernels::addInPlace(meta.grad, g);
    }
    fireHooks(meta);
    return {};
  }

  /// Offers the leaf's gradient buffer for a direct write (see takeGradTarget).
  bool offer(const Shape& shape, DType dtype, GradTarget* target) {
    std::shared_ptr<TensorImpl> impl = leaf_.lock();
    if (!impl || impl->autograd == nullptr) return false;
    Tensor leaf(impl);
    if (leaf.shape() != shape || leaf.dtype() != dtype) return false;
    AutogradMeta& meta = *impl->autograd;
    if (!meta.grad.defined()) {
      meta.grad = Tensor::empty(shape, dtype);
      meta.gradIsZero = true;
    }
    if (meta.grad.dtype() != dtype || !meta.grad.isContiguous()) return false;
    target->buffer = meta.grad;
    target->accumulate = !meta.gradIsZero;
    meta.gradIsZero = false;
    return true;
  }

  /// Completes a gradient written directly into the buffer: fires the hooks.
  void finishDirect() {
    std::shared_ptr<TensorImpl> impl = leaf_.lock();
    if (impl && impl->autograd) fireHooks(*impl->autograd);
  }

 private:
  static void fireHooks(AutogradMeta& meta) {
    if (meta.hooks.empty()) return;
    // Copy the hook list: a hook may remove itself.
    auto hooks = meta.hooks;
    for (auto& [id, hook] : hooks) hook(meta.grad);
  }

  std::weak_ptr<TensorImpl> leaf_;
};

struct ReadyOrder {
  bool operator()(Node* a, Node* b) const {
    if (a->isAccumulator() != b->isAccumulator()) return b->isAccumulator();
    return a->sequence < b->sequence;
  }
};

/// What takeGradTarget needs to know about the node whose backward runs now.
struct ApplyContext {
  Node* node = nullptr;
  const std::unordered_map<Node*, int>* dependencies = nullptr;
  const std::unordered_map<Node*, Tensor>* buffers = nullptr;
  std::vector<char>* taken = nullptr;
};

thread_local ApplyContext* tApply = nullptr;

}  // namespace

bool takeGradTarget(size_t input, const Shape& shape, DType dtype, GradTarget* target) {
  ApplyContext* ctx = tApply;
  if (!ctx || input >= ctx->node->next.size()) return false;
  Node* next = ctx->node->next[input].get();
  if (!next || !next->isAccumulator() || (*ctx->taken)[input]) return false;
  // Only when this edge is the last one into the accumulator and nothing is pending there.
  auto dep = ctx->dependencies->find(next);
  if (dep == ctx->dependencies->end() || dep->second != 1 || ctx->buffers->count(next)) return false;
  for (size_t j = 0; j < ctx->node->next.size(); ++j)
    if (j != input && ctx->node->next[j].get() == next) return false;
  if (!static_cast<AccumulateGrad*>(next)->offer(shape, dtype, target)) return false;
  (*ctx->taken)[input] = 1;
  return true;
}

bool isGradEnabled() { return tGradEnabled; }
void setGradEnabled(bool enabled) { tGradEnabled = enabled; }

bool needsRecord(std::initializer_list<const Tensor*> inputs) {
  if (!tGradEnabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requiresGrad()) return true;
  return false;
}

bool needsRecord(const std::vector<Tensor>& inputs) {
  if (!tGradEnabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requiresGrad()) return true;
  return false;
}

std::shared_ptr<Node> gradientEdge(const Tensor& t) {
  if (!t.defined() || !t.requiresGrad()) return nullptr;
  AutogradMeta& meta = *t.impl()->autograd;
  if (meta.gradFn) return meta.gradFn;
  if (!meta.accumulator) meta.accumulator = std::make_shared<AccumulateGrad>(t.implPtr());
  return meta.accumulator;
}

Tensor record(Tensor out, const std::vector<Tensor>& inputs, const char* name, BackwardFn fn) {
  if (!needsRecord(inputs)) return out;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  node->sequence = tNextSequence++;
  node->next.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next.push_back(gradientEdge(t));
  // `out` may be a fresh view sharing storage with an input; it gets its own autograd slot.
  auto meta = std::make_shared<AutogradMeta>();
  meta->requiresGrad = true;
  meta->gradFn = std::move(node);
  out.impl()->autograd = std::move(meta);
  return out;
}

namespace {
// Whether a node's pending gradient can take the next contribution in place: the buffer is
// the only handle on its memory (no other node's gradient, saved tensor or hook holds it) and
// the contribution has its shape and type, as PyTorch's input buffers accumulate.
bool takesInPlace(const Tensor& slot, const Tensor& more) {
  return solelyOwned(slot) && slot.shape() == more.shape() && slot.dtype() == more.dtype();
}
}  // namespace

void runBackward(const Tensor& root, const Tensor& seed) {
  KOLO_CHECK(root.defined(), "backward() on an undefined tensor");
  if (!root.requiresGrad())
    KOLO_THROW(InvalidArgument, "backward(): tensor of shape ", shapeString(root.shape()),
               " does not require grad (no parameter or input with requiresGrad reaches it)");
  Tensor grad = seed;
  if (!grad.defined()) {
    KOLO_CHECK_EQ(root.numel(), 1, "backward() without a gradient needs a one-element tensor, got shape ",
                  shapeString(root.shape()));
    grad = Tensor::ones(root.shape(), root.dtype());
  } else {
    KOLO_CHECK(grad.shape() == root.shape(), "backward(): gradient shape ", shapeString(grad.shape()),
               " differs from tensor shape ", shapeString(root.shape()));
  }
  std::shared_ptr<Node> rootNode = gradientEdge(root);

  // Count, for every reachable node, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{rootNode.get()};
  dependencies[rootNode.get()] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& next : node->next) {
      if (!next) continue;
      auto [it, inserted] = dependencies.try_emplace(next.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(next.get());
    }
  }

  NoGradGuard noGrad;
  std::unordered_map<Node*, Tensor> buffers;
  buffers[rootNode.get()] = grad;
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  ready.push(rootNode.get());
  std::vector<char> taken;
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Tensor input;
    if (auto it = buffers.find(node); it != buffers.end()) {
      input = std::move(it->second);
      buffers.erase(it);
    }
    std::vector<Tensor> outputs;
    taken.assign(node->next.size(), 0);
    if (input.defined()) {
      ApplyContext ctx{node, &dependencies, &buffers, &taken};
      ApplyContext* outer = tApply;
      tApply = &ctx;
      try {
        outputs = node->apply(input);
      } catch (...) {
        tApply = outer;
        throw;
      }
      tApply = outer;
    }
    for (size_t i = 0; i < node->next.size(); ++i) {
      Node* next = node->next[i].get();
      if (!next) continue;
      if (taken[i]) {
        // Written straight into the leaf's buffer; this was its last contribution.
        --dependencies[next];
        static_cast<AccumulateGrad*>(next)->finishDirect();
        continue;
      }
      if (i < outputs.size() && outputs[i].defined()) {
        Tensor& slot = buffers[next];
        if (!slot.defined()) {
          slot = outputs[i];
        } else if (takesInPlace(slot, outputs[i])) {
          kernels::addInPlace(slot, outputs[i]);
        } else {
          slot = kernels::binary(kernels::BinaryOp::Add, slot, outputs[i]);
        }
      }
      if (--dependencies[next] == 0) ready.push(next);
    }
  }
}

namespace {
// Tensor's view methods and backward() reach the engine through these (the tensor layer
// does not link this one). This file is linked whenever any op that records is used.
[[maybe_unused]] const bool kHooksRegistered = [] {
  detail::registerAutogradHooks({.record = &record, .backward = &runBackward});
  return true;
}();
}  // namespace

}  // namespace kolo::autograd
