// Engines: one object per strategy family that owns the model, its optimizer and the job's
// communication, and takes one optimizer step per global batch (DeepSpeed's engine, Keras's
// model under a tf.distribute strategy). train::fit drives any Engine; DataParallelEngine is
// the family of every synchronous data-parallel strategy (one-device, mirrored,
// central-storage, multi-worker-mirrored, fsdp/HSDP) over the user's own model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/data.h"
#include "kolo/memory.h"
#include "kolo/nn/module.h"
#include "kolo/observe.h"
#include "kolo/parallel/balancer.h"
#include "kolo/parallel/comm_hook.h"
#include "kolo/parallel/strategy.h"
#include "kolo/train/evaluate.h"
#include "kolo/train/state.h"

namespace kolo::train {

class ElasticEngine;

/// Which part of every global batch this process loads: the samples a
/// data::DistributedSampler of (rank, worldSize) gives it.
struct DataShard {
  int rank = 0;
  int worldSize = 1;
};

/// What one step took and held on this rank, as train::fit measures it; an engine that knows
/// more refines it (Engine::refineStepFigures).
struct StepFigures {
  /// Forward, backward and update, less waiting for other ranks.
  double computeSeconds = 0.0;
  /// The most tensor bytes alive during the step beyond those alive just before it
  /// (activations, saved tensors, gradients, messages, temporaries).
  int64_t peakStepBytes = 0;
  /// Micro-batches whose activations were alive at once (pipeline stages; 1 elsewhere).
  int64_t microBatchesHeld = 1;
  /// The most bytes of activations kept at a pipeline stage's boundaries (0 elsewhere).
  int64_t boundaryBytes = 0;
};

/// The interface train::fit drives. An engine is also Stateful: its state (weights,
/// optimizer state, what its communication keeps) is what a checkpoint holds. Not
/// thread-safe: one thread drives an engine; the calls marked collective are made by every
/// rank of the engine's job in the same order.
class Engine : public Stateful {
 public:
  ~Engine() override = default;

  /// One optimizer step on this process's part `batch` of the global batch (dataShard())
  /// with learning rate `lr`. Returns the mean loss over the global batch, the same on every
  /// rank. Blocking; collective. Throws what the model, the loss or the communication throws.
  virtual double step(const data::Batch& batch, double lr) = 0;
  /// Gradient accumulation (FitOptions::accumulate): each later step() takes every replica's
  /// rows as `microBatches` equal micro-batches, forward and backward one after the other,
  /// with no gradient communication until the last (DDP's no_sync), then one update; the
  /// same as one step on the whole batch for a model without batch norm. Default: throws
  /// InvalidArgument naming the engine for anything but 1.
  virtual void setAccumulate(int microBatches);
  /// The loss and accuracy of the trained weights over `dataset` (train::evaluate), the work
  /// split over the engine's ranks (options.communicator is the engine's). Leaves the model
  /// in training mode. Blocking; collective.
  virtual EvaluateResult evaluate(const data::Dataset& dataset, EvaluateOptions options = {}) = 0;
  /// The part of every global batch this process loads.
  virtual DataShard dataShard() const = 0;
  /// The model holding the trained weights (replica 0 or the central variables); where
  /// they are sharded (fsdp) it holds them whole only after gatherModel().
  virtual nn::Module& model() = 0;
  /// Makes model() hold every weight whole until the next step() (for evaluating or saving
  /// it). Blocking; collective where the weights are sharded, else nothing.
  virtual void gatherModel() {}
  /// The learning rate of the last step (or the optimizer's initial one).
  virtual double lr() const = 0;
  /// The job's communicator; null for strategies inside one process.
  virtual std::shared_ptr<comm::Communicator> communicator() const = 0;
  /// The strategy's name as metrics and logs give it ("multi-worker-mirrored", ...).
  virtual std::string name() const = 0;
  /// Replicas of the model computing in the whole job.
  virtual int replicas() const = 0;
  /// The all-reduce algorithm metrics name ("auto", "ring", ...; "" when none).
  virtual std::string algorithm() const { return ""; }
  /// Further fields of the log line fit writes when training starts.
  virtual observe::Fields describe() const { return {}; }
  /// The reducer whose timings (communication, exposed time) fit's step-time breakdown
  /// reads; null when there is none.
  virtual const parallel::Reducer* reducer() const { return nullptr; }
  /// The balancer splitting each global batch by measured speed (then dataShard() is the
  /// whole batch and step() takes this rank's share); null when the split is even. fit
  /// records each step's busy time into it and re-plans when due.
  virtual parallel::Balancer* balancer() { return nullptr; }
  /// The elastic protocol fit drives around step() when the job's membership may change
  /// (train::ElasticEngine); null for a fixed set of ranks.
  virtual ElasticEngine* elastic() { return nullptr; }
  /// Refines fit's figures of the step just taken (FitSummary::ranks): a pipeline stage gives
  /// its own compute time (waits for its neighbours left out), the micro-batches it held and
  /// its boundary bytes. Default: fit's figures as they are.
  virtual void refineStepFigures(StepFigures& figures) const { (void)figures; }
  /// This process's rank in communicator() (0 without one).
  virtual int rank() const;
  /// True on the one process that writes metrics, checkpoints and progress (rank 0).
  bool isPrimary() const { return rank() == 0; }
  /// Tensor bytes alive when the engine began to be built (the data loaded before it):
  /// fit's "tensor memory" figures count what is alive beyond them.
  int64_t tensorBytesBefore() const { return tensorBytesBefore_; }

 private:
  int64_t tensorBytesBefore_ = liveTensorBytes();
};

/// How a DataParallelEngine distributes.
struct DataParallelOptions {
  /// The strategy and its settings: kind, replicas and reduction (mirrored,
  /// central-storage), communicator (multi-worker-mirrored and fsdp: required, e.g.
  /// parallel::init()), reducer buckets, overlap and algorithm, fsdp's shard level, shard
  /// group and units. Its clipNorm is ignored: see clipNorm below.
  parallel::StrategyOptions strategy{};
  /// The mean loss of a batch; default cross-entropy of model(inputs) against labels.
  parallel::LossFn loss{};
  /// Clip the gradient's global norm to this before each update (0: off). One-device and
  /// fsdp only (InvalidArgument elsewhere).
  double clipNorm = 0.0;
  /// A communication hook on the reducer (gradient compression,
  /// parallel::compression::makeCommHook); null: the plain all-reduce. Multi-worker-mirrored
  /// only (InvalidArgument elsewhere). Its state is part of the engine's checkpoint state.
  std::shared_ptr<parallel::CommHook> commHook{};
  /// > 0: split each global batch of this many samples over the ranks in proportion to their
  /// measured speed (parallel::Balancer, multi-worker-mirrored only); fit's batch must be
  /// the same. 0: an even split.
  int64_t balanceBatch = 0;
  /// The balancer's settings (re-plan interval, granule) when balanceBatch > 0.
  parallel::BalancerOptions balancer{};
  /// Activation checkpointing per top-level layer (nn::Sequential::setRecompute): each
  /// layer's activations are computed again in backward instead of kept, one more forward
  /// per step for less memory; the weights do not change. The model must be an
  /// nn::Sequential (InvalidArgument otherwise: a model of another shape calls nn::checkpoint
  /// in its own forward). Every strategy, fsdp included.
  bool recompute = false;
};

/// Synchronous data parallelism over the user's own model: every replica starts from
/// replica 0's (rank 0's) weights, and each step averages the replicas' gradients before one
/// optimizer update, so N ranks with a global batch B take the steps one device takes with
/// batch B (to float rounding). Stateful: weights and optimizer state whole (assembled from
/// the shards under fsdp), the communication hook's per-rank state, the strategy's name.
class DataParallelEngine : public Engine {
 public:
  /// Builds the replicas from `model` (called once per replica) and their optimizers from
  /// `optimizer`. Blocking; collective for multi-worker-mirrored and fsdp (rank 0's weights
  /// are broadcast). Throws InvalidArgument for bad options (a missing communicator, clipNorm
  /// or a hook or balancing where the strategy has none), naming the option and strategy.
  DataParallelEngine(parallel::ModelFactory model, parallel::OptimizerFactory optimizer,
                     DataParallelOptions options);
  ~DataParallelEngine() override;
  DataParallelEngine(const DataParallelEngine&) = delete;
  DataParallelEngine& operator=(const DataParallelEngine&) = delete;

  /// One synchronous step: `batch` is this process's part of the global batch (its rows
  /// split over the local replicas; with balancing the whole global batch, of which this
  /// rank takes its share). Returns the global mean loss. Blocking; collective.
  double step(const data::Batch& batch, double lr) override;
  /// Every strategy accumulates (parallel::Strategy::setAccumulate); not with
  /// balancing (InvalidArgument).
  void setAccumulate(int microBatches) override;
  EvaluateResult evaluate(const data::Dataset& dataset, EvaluateOptions options = {}) override;
  DataShard dataShard() const override;
  nn::Module& model() override;
  void gatherModel() override;
  double lr() const override;
  std::shared_ptr<comm::Communicator> communicator() const override;
  std::string name() const override;
  int replicas() const override;
  std::string algorithm() const override;
  observe::Fields describe() const override;
  const parallel::Reducer* reducer() const override;
  parallel::Balancer* balancer() override;
  /// Weights (model().stateDict(), whole), the optimizer state (whole), the hook's state of
  /// every rank ("compress.rank<R>.<name>") and metadata "strategy" and "replicas".
  /// Blocking; collective.
  StateDict stateDict() override;
  /// Loads weights and optimizer state on rank 0, then every replica and rank takes them
  /// from it (any strategy or rank count may load what another saved); a hook's state needs
  /// the rank count that saved it. Blocking; collective. Throws Mismatch naming what differs.
  void loadStateDict(const StateDict& state) override;

  /// The strategy underneath (for what the engine does not wrap).
  parallel::Strategy& strategy();
  /// The optimizer of model().
  optim::Optimizer& optimizer();

 private:
  DataParallelOptions options_;
  std::unique_ptr<parallel::Balancer> balancer_;  // outlives the strategy's loss
  std::unique_ptr<parallel::Strategy> strategy_;
};

}  // namespace kolo::train
