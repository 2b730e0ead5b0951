// The whole model's state and the parts ranks hold of it (pipeline stages, tensor-parallel
// shards): the pieces a part sends to be reassembled, the whole state sent to every rank, and
// a part cut back from it. Optimizer slots that are per-element companions of a parameter
// (momentum, Adam's moments) are cut and reassembled as their parameter is; anything else
// (a step count) is the same on every rank and taken whole.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/optim.h"
#include "kolo/parallel/mesh.h"
#include "kolo/parallel/tied_parameters.h"
#include "kolo/train/state.h"

namespace kolo::train::detail {

/// How each parameter of a part was cut from the whole model's (by whole-model name; a name
/// that is missing is replicated).
using ShardSpecs = std::map<std::string, parallel::ShardSpec>;

/// The module's state-dict tensors as pieces of the whole model's.
std::vector<parallel::ModelPiece> weightPieces(nn::Module& module, const ShardSpecs& specs);
/// The optimizer state of the module's parameters as "<parameter>/<slot>" pieces.
std::vector<parallel::ModelPiece> optimizerPieces(nn::Module& module, const optim::StateDict& state,
                                                  const ShardSpecs& specs);
/// The whole tensors on rank 0 of `group` (parallel::gatherWholeTensors); without a group, the
/// pieces themselves. Blocking; collective over the group.
NamedTensors gatherPieces(comm::Communicator* group, const std::vector<parallel::ModelPiece>& pieces);

/// A checkpoint's whole weights and optimizer state.
struct WholeState {
  NamedTensors weights;
  std::string optimizerKind;
  optim::StateDict optimizer;
};
/// Every rank returns rank 0's `state`. Blocking; collective over `comm`.
WholeState broadcastWholeState(comm::Communicator& comm, const WholeState& state);

/// A rank's part: its module and optimizer, the parameters' cuts, its tensor rank of `parts`,
/// and the model's tied parameters (a copy on this part may find its optimizer state under
/// the other name: a state written where one tensor held both).
struct PartShape {
  nn::Module* module = nullptr;
  optim::Optimizer* optimizer = nullptr;
  ShardSpecs specs;
  int tensorRank = 0;
  int parts = 1;
  std::vector<parallel::TiedParameter> ties{};
};
/// Copies this part's pieces of `whole` into the module and its optimizer. Throws Mismatch
/// naming the tensor when one is missing or its piece has another shape, or when the
/// optimizer kind differs.
void loadPart(const WholeState& whole, const PartShape& part);

/// Every rank of `comm` learns whether each loaded (`problem` null) before going on: the
/// ranks that failed rethrow their error, the others throw Mismatch naming the first rank
/// that failed and `what`. Blocking; collective.
void agreeLoaded(comm::Communicator* comm, const std::exception_ptr& problem, const std::string& what);

/// Runs `work` on rank 0 of `comm` (every rank without one), and every rank learns whether
/// it succeeded: rank 0 rethrows its error, the others throw PeerError naming rank 0 and
/// `what`. Blocking; collective.
void onRoot(comm::Communicator* comm, const std::string& what, const std::function<void()>& work);

}  // namespace kolo::train::detail
