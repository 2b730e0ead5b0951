// Reverse-mode automatic differentiation: graph nodes, the per-tensor autograd slot, grad
// mode (NoGradGuard), and the engine that runs backward passes with gradient-ready hooks.
// Differentiable operations are declared in kolo/ops.h; they record nodes through record().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::autograd {

/// One recorded operation. Its `next` edges point at the nodes producing each input
/// (null where that input needs no gradient); apply() maps the gradient of the output to
/// one gradient per input (undefined when an input gets none).
class Node {
 public:
  virtual ~Node() = default;
  virtual std::vector<Tensor> apply(const Tensor& gradOutput) = 0;
  virtual std::string name() const = 0;
  /// True for the nodes that accumulate into leaves; the engine runs them first when ready.
  virtual bool isAccumulator() const { return false; }

  std::vector<std::shared_ptr<Node>> next;
  uint64_t sequence = 0;  // creation order; later nodes run first among ready ones
};

// AutogradMeta, the per-tensor slot these nodes hang from, is declared with Tensor in
// kolo/tensor.h.

/// Whether operations record nodes on this thread (true by default).
bool isGradEnabled();
void setGradEnabled(bool enabled);

/// RAII scope in which no operation records a node (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(isGradEnabled()) { setGradEnabled(false); }
  ~NoGradGuard() { setGradEnabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// Backward function of a recorded op: gradient of the output -> one gradient per input.
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& gradOutput)>;

/// True when grad mode is on and any of the inputs requires grad.
bool needsRecord(std::initializer_list<const Tensor*> inputs);
bool needsRecord(const std::vector<Tensor>& inputs);

/// Attaches a node named `name` to `out` whose backward is `fn` over `inputs`, when
/// needsRecord(inputs); returns out (marked requiresGrad when recorded).
Tensor record(Tensor out, const std::vector<Tensor>& inputs, const char* name, BackwardFn fn);

/// The node a gradient for `t` flows into: its gradFn, or its leaf accumulator; null when
/// t does not require grad.
std::shared_ptr<Node> gradientEdge(const Tensor& t);

/// Where a backward function may write the gradient of one input directly: the leaf's
/// gradient buffer, overwritten (accumulate false) or added to (accumulate true).
struct GradTarget {
  Tensor buffer;
  bool accumulate = false;
};

/// Inside a node's backward function during runBackward: offers the gradient buffer of input
/// `input` when that input is a leaf whose gradient this node completes alone (no other
/// contribution pending) and the buffer is contiguous with `shape` and `dtype`. On true the
/// caller must write the full gradient into target->buffer (beta 0 or 1 per `accumulate`)
/// and return an undefined tensor for that input; the engine then fires the leaf's
/// gradient-ready hooks as if it had accumulated it.
bool takeGradTarget(size_t input, const Shape& shape, DType dtype, GradTarget* target);

/// Runs a backward pass from root with seed gradient (ones when undefined and root has one
/// element). Leaves accumulate into .grad(); each leaf's hooks fire as soon as the last
/// node contributing to it has run. Throws InvalidArgument if root does not require grad.
void runBackward(const Tensor& root, const Tensor& seed);

}  // namespace kolo::autograd
