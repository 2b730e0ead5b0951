// Fully sharded data parallelism (ZeRO stages 2 and 3, PyTorch FSDP's SHARD_GRAD_OP and
// FULL_SHARD): one replica per rank, as multi-worker-mirrored, but each rank keeps only its
// 1/N shard of the gradients and of the optimizer state (ZeRO-2), and with `full` of the
// parameters too (ZeRO-3).
//
// The model is cut into units, one per top-level child module that holds parameters (or
// runs of consecutive children, FsdpOptions::unitMinParameters). A
// unit's parameters live in one flat f32 buffer, padded to a multiple of N so that rank r
// owns elements [r*S, (r+1)*S) with S = padded/N. A step:
//  - ZeRO-3 only: before a unit's forward the ranks all-gather its parameters into the flat
//    buffer and free it again after the forward; before the unit's backward (the gradient of
//    its output arrives) they gather it again, and free it once its gradients are complete.
//    A unit whose backward does not read its parameters is not gathered for backward: when
//    its forward recorded no node that kept a handle to them (a first Linear or Conv2d, whose
//    input is the data and needs no gradient: dW = dY^T X and db = sum dY use no W);
//  - before a unit's backward its parameters' gradients become views of one flat buffer,
//    which backward writes into; as soon as the last of them is ready, the buffer is
//    reduce-scattered (summed, then divided by N) into this rank's gradient shard and freed.
//    The gradient shards hold memory from the reduce-scatter to the optimizer's update only;
//  - the optimizer updates this rank's shard of every parameter with its shard of the state
//    (an elementwise update, so the result is the one data parallelism computes);
//  - ZeRO-2 only: the updated shards are all-gathered back into every unit's buffer.
//
// HSDP (shardGroup G < N): the ranks form N/G shard groups of G consecutive ranks (one host's
// ranks, say); the units are sharded over a group's G ranks, and each group holds a replica of
// the whole sharded state. The gradients are reduce-scattered inside the group, then each
// shard is all-reduced with the same shard of the other groups: the slow links between
// groups carry 1/G of the gradients, and the parameters' gathers stay inside the group.
//
// Checkpoints hold whole tensors under the model's names (the file one-device training
// writes): consolidateState() gathers the parameters and assembles an optimizer of the same
// kind over them (checkpointOptimizer()); after loading into both, syncReplicas() broadcasts
// them from rank 0 and every rank keeps its shards, whatever the rank count was at saving.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/parallel/strategy.h"

namespace kolo::parallel {

const char* shardLevelName(ShardLevel level);
/// Parses "grad" or "full"; throws InvalidArgument naming anything else.
ShardLevel parseShardLevel(const std::string& name);

struct FsdpOptions {
  ShardLevel shard = ShardLevel::Full;
  /// Algorithm and deadline of the all-gathers and reduce-scatters.
  comm::CollectiveOptions collective = {};
  /// ZeRO-3: start gathering the next unit (in the order the first step's forward reached
  /// the units; in reverse during backward) while the current one computes.
  bool prefetch = true;
  /// Ranks per shard group (HSDP); 0 or the rank count: one group of every rank;
  /// kShardGroupPerHost: the ranks of one host (the launch's local ranks, as PyTorch's
  /// HYBRID_SHARD). Must divide the rank count.
  int shardGroup = 0;
  /// Clips the global norm of the averaged gradient to this before each update, as
  /// optim::clipGradNorm on one device (0: off).
  double clipNorm = 0.0;
  /// A unit takes consecutive top-level children until it holds at least this many
  /// parameters (PyTorch FSDP's size-based wrapping): fewer, larger units mean fewer
  /// collectives per step and a larger gathered unit at the peak. 0: one unit per child.
  int64_t unitMinParameters = 0;
};

/// Builds the fully sharded strategy over `communicator` (collective: rank 0's parameters and
/// buffers are broadcast, then each rank keeps its shards). model() is the model whose
/// parameters the units gather; between steps under ZeRO-3 its parameters hold no storage
/// until gatherModel() is called (evaluation, saving). optimizer() is the optimizer over this
/// rank's shards, one tensor per parameter named as the parameter (absent where the rank owns
/// none of it). Throws InvalidArgument for a missing communicator, a parameter that is not f32
/// or that belongs to the root module instead of a child, or a shard group that does not
/// divide the rank count (construction then splits the communicator, collectively).
std::unique_ptr<Strategy> makeFsdpStrategy(std::shared_ptr<comm::Communicator> communicator,
                                           FsdpOptions options, ModelFactory modelFactory,
                                           OptimizerFactory optimizerFactory, LossFn loss = nullptr);

}  // namespace kolo::parallel
