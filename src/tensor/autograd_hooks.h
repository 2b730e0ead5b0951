// What the tensor layer asks of the autograd layer, which sits above it: recording a
// view's backward and running a backward pass. The autograd layer registers these when it
// is linked (src/autograd/engine.cc), as PyTorch's c10 registers its variable hooks, so the
// tensor library builds and links without it.
#pragma once

#include <functional>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::detail {

struct AutogradHooks {
  /// autograd::record: attaches a node named `name` whose backward is `fn` over `inputs`.
  Tensor (*record)(Tensor out, const std::vector<Tensor>& inputs, const char* name,
                   std::function<std::vector<Tensor>(const Tensor&)> fn) = nullptr;
  /// autograd::runBackward.
  void (*backward)(const Tensor& root, const Tensor& seed) = nullptr;
};

/// Called once by the autograd layer at static initialisation.
void registerAutogradHooks(const AutogradHooks& hooks);
/// The registered hooks; throws kolo::Error naming the tensor when none are (autograd not linked).
const AutogradHooks& autogradHooks(const Tensor& forTensor);

}  // namespace kolo::detail
