// Synchronous data-parallel strategies behind one interface, as tf.distribute names them:
// one-device, mirrored (K replicas on threads), multi-worker-mirrored (one replica per
// rank, gradients all-reduced through a Communicator) and central-storage (variables held
// once, K replicas compute gradients against them). One training loop drives them all.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/optim.h"
#include "kolo/parallel/reducer.h"
#include "kolo/parallel/replica_group.h"
#include "kolo/tensor.h"

namespace kolo::parallel {

/// Builds one replica of the model. Called once per replica; the strategy makes the
/// replicas' weights identical (replica 0's, or rank 0's), so it need not be deterministic.
using ModelFactory = std::function<std::shared_ptr<nn::Module>()>;
/// Builds the optimizer over a replica's (or the central) parameters.
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(const NamedTensors&)>;
/// The mean loss of `model` on a batch. Default: cross-entropy of model(inputs) vs labels.
using LossFn = std::function<Tensor(nn::Module& model, const Tensor& inputs, const Tensor& labels)>;

enum class StrategyKind {
  OneDevice,
  Mirrored,
  MultiWorkerMirrored,
  CentralStorage,
  FullyShardedDataParallel  // "fsdp" (kolo/parallel/fsdp.h)
};

/// What fsdp shards across the ranks besides the optimizer state.
enum class ShardLevel {
  Gradients,  // `grad`: ZeRO-2, parameters stay whole on every rank
  Full,       // `full`: ZeRO-3, parameters are sharded too and gathered per unit
};

const char* strategyKindName(StrategyKind kind);
/// Parses "one-device", "mirrored", "multi-worker-mirrored", "central-storage", "fsdp".
StrategyKind parseStrategyKind(const std::string& name);

/// StrategyOptions::shardGroup and FsdpOptions::shardGroup: one shard group per host (HSDP).
inline constexpr int kShardGroupPerHost = -1;

struct StrategyOptions {
  StrategyKind kind = StrategyKind::OneDevice;
  /// Replicas in this process (mirrored, central-storage).
  int replicas = 2;
  /// In-process reduction of mirrored.
  LocalReduction reduction = LocalReduction::Ring;
  /// The job's communicator (multi-worker-mirrored, fsdp); required there, ignored elsewhere.
  std::shared_ptr<comm::Communicator> communicator;
  /// Buckets and all-reduce algorithm (reducer.collective.algorithm) of the reducers.
  ReducerOptions reducer;
  /// What fsdp shards besides the optimizer state.
  ShardLevel shard = ShardLevel::Full;
  /// fsdp: ranks per shard group (HSDP: shard inside a group, replicate across the groups);
  /// 0 shards over every rank, kShardGroupPerHost over each host's ranks.
  int shardGroup = 0;
  /// fsdp: the gradient's global norm is clipped to this before each update (0: off).
  double clipNorm = 0.0;
  /// fsdp: the fewest parameters of a unit (FsdpOptions::unitMinParameters); 0: one per child.
  int64_t unitMinParameters = 0;
  /// Synchronised batch norm (parallel::convertSyncBatchNorm) in every replica: each batch
  /// norm's statistics are those of the step's global batch over every replica of the job
  /// (the replica threads of mirrored and central-storage, the ranks of
  /// multi-worker-mirrored and fsdp), so that N replicas take one device's steps on the
  /// global batch. One-device: nothing changes.
  bool syncBatchNorm = false;
};

/// Result of one synchronous step.
struct StepResult {
  /// Mean loss over the global batch (the average of the replicas' mean losses).
  double loss = 0.0;
};

/// One synchronous data-parallel training scheme. Usage per step: the loop gives the
/// process's share of the global batch to trainStep(), which splits it over the local
/// replicas, reduces their gradients and applies one optimizer update everywhere. Data
/// sharding across processes follows dataRank()/dataWorldSize() (a DistributedSampler).
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual StrategyKind kind() const = 0;
  std::string name() const { return strategyKindName(kind()); }
  /// Replicas computing in this process.
  virtual int localReplicas() const = 0;
  /// Replicas in the whole job (local replicas over every process).
  virtual int replicas() const { return localReplicas() * dataWorldSize(); }
  /// This process's index among the processes that read data, and their number.
  virtual int dataRank() const { return 0; }
  virtual int dataWorldSize() const { return 1; }
  /// True for the one process that writes metrics, saved weights and checkpoints.
  bool isPrimary() const { return dataRank() == 0; }

  /// One synchronous step on this process's share of the global batch: inputs [b, ...],
  /// labels [b], with b divisible by localReplicas(). Blocking; collective across processes
  /// for multi-worker-mirrored. Rethrows errors of any replica.
  virtual StepResult trainStep(const Tensor& inputs, const Tensor& labels) = 0;

  /// The model holding the trained weights (replica 0, or the central variables): use it
  /// for evaluation, saving and checkpoints.
  virtual nn::Module& model() = 0;
  /// The optimizer of model().
  virtual optim::Optimizer& optimizer() = 0;
  /// The optimizer whose state checkpoints save and load: optimizer(), except under fsdp,
  /// where it is an optimizer of the same kind over model()'s whole parameters, whose state
  /// consolidateState() assembles from the shards and syncReplicas() hands back to them.
  virtual optim::Optimizer& checkpointOptimizer() { return optimizer(); }
  /// Sets the learning rate of every replica's optimizer (schedules call it per step).
  virtual void setLr(double lr) { optimizer().setLr(lr); }
  /// Gradient accumulation: from the next trainStep() on, each replica's rows are taken as
  /// `microBatches` equal micro-batches, forward and backward one after the other, each loss
  /// scaled by 1/microBatches, with no gradient communication until the last one's backward
  /// (DDP's no_sync); then one update. Without batch norm this is one step on the whole
  /// rows (to float rounding); a batch norm normalises each micro-batch with its own
  /// statistics, as in PyTorch. trainStep() then needs rows divisible by localReplicas() x
  /// microBatches. fsdp reduce-scatters every micro-batch's gradients and adds them in the
  /// shards (gradients stay sharded; K reduce-scatters a step). Throws InvalidArgument for
  /// microBatches < 1.
  virtual void setAccumulate(int microBatches);
  /// The micro-batches of each step (1: no accumulation).
  int accumulate() const { return accumulate_; }
  /// After model() and checkpointOptimizer() were changed from outside (loaded from a
  /// checkpoint), makes every replica (and, for multi-worker and fsdp, every rank from rank 0)
  /// agree with them. Collective for multi-worker-mirrored and fsdp; fsdp needs gatherModel()
  /// before the loading.
  virtual void syncReplicas() = 0;
  /// Collective for multi-worker-mirrored and fsdp: makes checkpointOptimizer()'s state (and
  /// under fsdp model()'s parameters) whole on this process before it is read (checkpoints),
  /// where updates are sharded across ranks.
  virtual void consolidateState() {}
  /// Collective for fsdp: makes model() hold every parameter whole until the next
  /// trainStep(), for evaluation and saving. Nothing to do where parameters are never sharded.
  virtual void gatherModel() {}
  /// The reducer of replica 0 (mirrored, multi-worker-mirrored), else null: for timelines.
  virtual Reducer* reducer() { return nullptr; }

 protected:
  int accumulate_ = 1;
};

/// Builds a strategy. Throws InvalidArgument for a replica count < 1, or a missing
/// communicator for multi-worker-mirrored. Construction is collective for
/// multi-worker-mirrored (parameters are broadcast from rank 0).
std::unique_ptr<Strategy> makeStrategy(const StrategyOptions& options, ModelFactory modelFactory,
                                       OptimizerFactory optimizerFactory, LossFn loss = nullptr);

/// Strategy options from command-line words (`kolo train --strategy S --replicas K
/// --reduction R --algorithm A`): `reduction` is reduce-to-one | hierarchical-copy | ring,
/// `algorithm` auto | ring | halving-doubling | tree | reduce-broadcast | hierarchical.
/// `communicator` is required for multi-worker-mirrored (e.g. parallel::init()). Throws
/// InvalidArgument naming a word it does not know.
StrategyOptions strategyOptionsFromNames(
    const std::string& strategy, int replicas, const std::string& reduction,
    const std::string& algorithm, std::shared_ptr<comm::Communicator> communicator = nullptr);

}  // namespace kolo::parallel
