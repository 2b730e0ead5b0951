// The pieces of fully sharded data parallelism that fsdp.cc (the step) and fsdp_state.cc (the
// optimizer state between whole tensors and shards, for checkpoints) share: a unit's flat,
// padded parameter buffer and the parts of the parameters a rank's shard holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/optim.h"
#include "kolo/parallel/reducer.h"

namespace kolo::parallel::detail {

// One unit: one or more consecutive top-level children and their parameters in one flat
// buffer of `padded` floats.
struct FsdpUnit {
  std::string name;                   // the children's names, joined by '+'
  std::vector<nn::Module*> modules;   // in the model's order
  NamedTensors parameters;        // full names, handles whose storage is `flat`
  std::vector<int64_t> offsets;   // of each parameter in the flat buffer
  int64_t numel = 0;              // the parameters' elements
  int64_t padded = 0;             // numel rounded up to a multiple of the shard group's size
  int64_t shardLength = 0;        // padded / ranks of the shard group
  std::shared_ptr<Storage> flat;  // shared by the parameters; bytes null while sharded
  Tensor shard;                   // [shardLength]: this rank's parameter elements
  Tensor gradShard;               // [shardLength]: their averaged gradient
  Tensor gradFlat;                // [padded], during backward: the parameters' gradients view it
  bool gathered = true;
  std::vector<std::unique_ptr<comm::Work>> pending;  // a prefetched gather in flight
  size_t ready = 0;      // gradients ready in this backward
  bool reduced = false;  // reduce-scattered in this backward
  // Handles to the parameters and their buffer before this step's forward; more after it
  // means a recorded node kept one, so backward reads the parameters (readInBackward).
  long referencesBeforeForward = 0;
  bool readInBackward = true;
};

// The part of one parameter that this rank's shard holds: elements [lo, hi) of its unit's
// flat buffer. The shard optimizer's i-th parameter is piece i.
struct FsdpPiece {
  size_t unit = 0;
  size_t parameter = 0;  // index in the unit's parameters
  int64_t lo = 0;
  int64_t hi = 0;
};

// Collective over the shard group `group`: fills `whole` (an optimizer over the units' whole
// parameters) with the state `shards` (over the pieces) holds across the group: per-element
// slots all-gathered unit by unit, per-parameter scalars (Adam's step) taken from a rank
// that holds part of the parameter; the step count and learning rate are the shards'.
void assembleWholeState(const std::vector<FsdpUnit>& units, const std::vector<FsdpPiece>& pieces,
                        const optim::Optimizer& shards, optim::Optimizer& whole,
                        comm::Communicator& group, const comm::CollectiveOptions& options);

// Local: the inverse for this rank of the group (`rank`): each unit's parameter shard from its
// gathered flat buffer, and `shards`' state cut from `whole`'s.
void takeShardState(std::vector<FsdpUnit>& units, const std::vector<FsdpPiece>& pieces,
                    const optim::Optimizer& whole, optim::Optimizer& shards, int rank);

}  // namespace kolo::parallel::detail
