// What the model-parallel training loop (train_pipeline.cc) drives on each rank: a pipeline
// stage (its layers possibly split over a tensor group) or a tensor-parallel shard of the
// model, each optionally a replica of a mesh whose data group averages its gradients.
#pragma once

#include <memory>
#include <vector>

#include "cli/train_loop.h"
#include "cli/train_model_state.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/parallel/pipeline.h"
#include "kolo/parallel/tensor_parallel.h"

namespace kolo::cli {

class Runner {
 public:
  virtual ~Runner() = default;
  /// One optimizer step over this rank's share of the global batch (collective over the
  /// model group, and over the data group in a mesh).
  virtual parallel::PipelineStepStats trainStep(const Tensor& inputs, const Tensor& labels) = 0;
  virtual optim::Optimizer& optimizer() = 0;
  /// Layer bounds of the stages ({0, n}: one part of every layer on each rank under tensor
  /// parallelism).
  virtual std::vector<int> bounds() const = 0;
  /// What this rank holds (the final gather; checkpoints and resume through statePart()).
  virtual ModelPart part() = 0;
  /// What checkpoints save and a resume loads into: part(), except under fsdp, where it is
  /// collective over the job and holds the whole model and the whole optimizer state on every
  /// rank (assembled from the shards).
  virtual ModelPart statePart() { return part(); }
  /// Collective over the job after a resume loaded statePart(): under fsdp every rank takes
  /// rank 0's loaded state and keeps its shards of it.
  virtual void stateLoaded() {}
  virtual int64_t parameterCount() { return part().module->parameterCount(); }
  /// Collective over the job, before the final gather: makes part() hold whole tensors where
  /// this rank's state is sharded (fsdp).
  virtual void gatherWhole() {}
};

/// A pipeline stage; `tp` is the tensor-parallel model the stage was cut from (a mesh with
/// tp > 1) or null; `data` the data group of a mesh, or null.
std::unique_ptr<Runner> makePipelineRunner(std::unique_ptr<parallel::PipelineStage> stage,
                                           std::shared_ptr<comm::Communicator> data,
                                           std::shared_ptr<parallel::TensorParallelModel> tp);

/// `whole` split over `comm` (every rank runs the whole batch through its shard of every
/// split layer), with the recipe's optimizer over its shards; `data` as above.
std::unique_ptr<Runner> makeTensorRunner(std::shared_ptr<comm::Communicator> comm,
                                         const nn::Sequential& whole,
                                         parallel::TensorParallelOptions options,
                                         const Recipe& recipe,
                                         std::shared_ptr<comm::Communicator> data);

/// Fully sharded data parallelism of `model` over every rank of `comm`: each rank trains on
/// its rows of the global batch.
std::unique_ptr<Runner> makeFsdpRunner(std::shared_ptr<comm::Communicator> comm,
                                       std::shared_ptr<nn::Sequential> model, parallel::StageLossFn loss,
                                       const Recipe& recipe, parallel::FsdpOptions options);

}  // namespace kolo::cli
