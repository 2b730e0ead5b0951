// A Horovod-style API for a user's own training loop: init() from the environment,
// broadcastParameters / broadcastOptimizerState from a root rank, and DistributedOptimizer,
// whose step() first finishes the gradient all-reduce that backward started.
#pragma once

#include <memory>

#include "kolo/comm/communicator.h"
#include "kolo/comm/init.h"
#include "kolo/nn/module.h"
#include "kolo/optim.h"
#include "kolo/parallel/reducer.h"

namespace kolo::parallel {

/// Joins the job this process was launched into (`kolo run`, mpirun/srun, torchrun's
/// variables) or makes a one-rank communicator; Horovod's hvd.init(). Blocks until every
/// rank has connected; throws Timeout naming the missing ranks.
std::shared_ptr<comm::Communicator> init(const comm::InitOptions& options = {});

/// Overwrites every rank's parameters with root's (collective: every rank calls it with
/// tensors of the same names, shapes and dtypes, in the same order).
void broadcastParameters(const NamedTensors& parameters, comm::Communicator& comm, int root = 0);
/// The same for a module's parameters and buffers (its stateDict()).
void broadcastParameters(const nn::Module& module, comm::Communicator& comm, int root = 0);

/// Makes every rank's optimizer state (per-parameter slots, step count, learning rate) equal
/// to root's. Collective; the optimizers must be of the same kind over the same parameters.
/// Throws Mismatch when a rank's optimizer kind differs from root's.
void broadcastOptimizerState(optim::Optimizer& optimizer, comm::Communicator& comm, int root = 0);

/// Gives each state slot saved flat the shape of its parameter (equal element count), as
/// Optimizer::loadStateDict expects.
optim::StateDict conformStateShapes(optim::StateDict state, const optim::Optimizer& optimizer);

/// Wraps an optimizer so that step() averages the gradients across ranks first. Owns a
/// Reducer over the optimizer's parameters: backward starts the bucket all-reduces through
/// the gradient-ready hooks, step() waits for them (Reducer::finalize) and then updates.
class DistributedOptimizer {
 public:
  /// Collective (the reducer broadcasts rank 0's parameters unless options say otherwise).
  DistributedOptimizer(std::unique_ptr<optim::Optimizer> optimizer,
                       std::shared_ptr<comm::Communicator> comm, ReducerOptions options = {});
  /// The same, and every step() also broadcasts the model's buffers from rank 0 (see
  /// Reducer and ReducerOptions::broadcastBuffers), so the next forward starts from rank 0's
  /// running statistics on every rank. The model must outlive the optimizer.
  DistributedOptimizer(std::unique_ptr<optim::Optimizer> optimizer,
                       std::shared_ptr<comm::Communicator> comm, const nn::Module& model,
                       ReducerOptions options = {});

  /// Finishes the gradient all-reduce, then applies the wrapped optimizer's update
  /// (Reducer::step: sharded across the ranks of one host with
  /// ReducerOptions::shardOptimizer). With gradient accumulation, call it after the last
  /// backward, outside the noSync() scope. Throws what Reducer::finalize throws.
  void step();
  /// Collective: makes the wrapped optimizer's state whole after sharded updates, before
  /// it is saved or broadcast (Reducer::consolidateOptimizerState).
  void consolidateState() { reducer_->consolidateOptimizerState(*optimizer_); }
  void zeroGrad() { optimizer_->zeroGrad(); }
  double lr() const { return optimizer_->lr(); }
  void setLr(double lr) { optimizer_->setLr(lr); }
  /// Scope of backward passes that accumulate gradients without communication.
  [[nodiscard]] Reducer::NoSyncGuard noSync() { return reducer_->noSync(); }
  /// Uneven inputs: call when this rank has no more batches (see Reducer::join).
  int64_t join() { return reducer_->join(); }
  /// The mean of the ranks' losses given to setLocalLoss before backward (see Reducer).
  void setLocalLoss(double loss) { reducer_->setLocalLoss(loss); }
  double globalLoss() const { return reducer_->globalLoss(); }

  optim::Optimizer& optimizer() { return *optimizer_; }
  Reducer& reducer() { return *reducer_; }
  comm::Communicator& communicator() { return *comm_; }

 private:
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<comm::Communicator> comm_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace kolo::parallel
