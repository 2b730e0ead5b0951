// Resume of an elastic run (train_elastic.cc) from a checkpoint's whole tensors: world rank
// 0 picks the newest good checkpoint, every rank reads it and copies what it holds of the
// weights and of the optimizer state (train/model_parts.h), whatever layout wrote it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "cli/train_loop.h"
#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/observe.h"
#include "kolo/optim.h"
#include "kolo/parallel/mesh.h"

namespace kolo::cli {

/// What one rank holds of the model.
struct ModelPart {
  nn::Module* module = nullptr;  // its layers or shards, under the whole model's names
  std::map<std::string, parallel::ShardSpec>
      specs;  // how its tensors were cut (none: whole tensors)
  optim::Optimizer* optimizer = nullptr;
  int tensorRank = 0, tensorSize = 1;  // its place in its tensor-parallel group
};

/// Collective over `world` (null: one rank): world rank 0 picks the newest good checkpoint
/// under --resume, every rank reads it and copies its part of the weights and of the optimizer
/// state. Returns the step to continue from. Throws FileError when there is no good
/// checkpoint, Mismatch when it was written for another model, batch or seed, or when a
/// tensor or the optimizer's kind does not fit.
int64_t resumeModelPart(const TrainConfig& config, comm::Communicator* world, const ModelPart& part,
                        observe::Logger& logger);

}  // namespace kolo::cli
