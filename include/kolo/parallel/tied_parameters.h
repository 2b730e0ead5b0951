// Parameters that two layers of a model share (tied input and output embeddings) under
// pipeline parallelism: when the two layers land on different stages, each stage holds a copy
// and the copies' gradients are summed between the two stages before every step, as
// Megatron-LM's embedding group does, so that the copies stay equal and the update is one
// device's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"

namespace kolo::parallel {

/// One tensor known by two names of the whole model's state dict ("0.weight" and "5.weight" for
/// a 2-block llama lm's embedding and head).
struct TiedParameter {
  std::string first, second;
};

/// The tensors that `model` holds under more than one state-dict name: (first name, each later
/// name), in state-dict order. Empty for a model without shared parameters.
std::vector<TiedParameter> tiedParameters(const nn::Module& model);

/// Sums the gradients of tied copies between pipeline stages. The stages are contiguous layer
/// ranges [bounds[s], bounds[s+1]) of a Sequential; a name's layer is its first component, a
/// child's name in `layerNames` (the Sequential's children in order, as the caller named
/// them: "embed", "blocks", ...) or, where `layerNames` is empty or holds no such name, the
/// layer's index ("0", "5"). A tie whose two names are on one stage needs
/// nothing (that stage holds one tensor); otherwise the two stages holding them exchange their
/// gradients over `pipeline` (one rank per stage, rank = stage) and each adds the other's, so
/// both hold the same sum, bit for bit.
class TiedGradients {
 public:
  /// `stageModule` is this stage's part with whole-model names (parallel::StageModule); a
  /// name that lies on this stage but is not one of its parameters, or one whose first
  /// component names no layer, throws InvalidArgument.
  TiedGradients(std::shared_ptr<comm::Communicator> pipeline, std::vector<int> bounds, int stage,
                const nn::Module& stageModule, const std::vector<TiedParameter>& ties,
                const std::vector<std::string>& layerNames = {});
  /// Exchanges and sums this stage's tied gradients with their partner stages. Blocking;
  /// collective between each tie's two stages (every stage may call it; those without a tie
  /// return at once). Call after backward, before the optimizer step.
  void sum();
  /// True when this stage shares no gradient with another.
  bool empty() const { return copies_.empty(); }

 private:
  struct Copy {
    Tensor parameter;
    int peer;  // the other stage's rank in the pipeline group
  };
  std::shared_ptr<comm::Communicator> pipeline_;
  std::vector<Copy> copies_;
};

}  // namespace kolo::parallel
