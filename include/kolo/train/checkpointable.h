// A model and its optimizer as one Stateful, for a training loop of one's own: train::save
// writes their state from rank 0 into the checkpoint format every strategy uses, and
// train::load reads it on rank 0 and broadcasts the parameters, buffers and optimizer state
// to every rank, as torch.distributed.checkpoint's state_dict helpers do for a module and its
// optimizer. fit's engines are Stateful of their own; this is for loops that drive a
// DistributedOptimizer (or a plain optimizer) themselves.
#pragma once

#include <memory>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/optim.h"
#include "kolo/parallel/distributed.h"
#include "kolo/train/state.h"

namespace kolo::train {

class Checkpointable : public Stateful {
 public:
  /// `model` and `optimizer` (over the model's parameters) on every rank of `communicator`
  /// (null: one process), held for as long as this object lives. Throws InvalidArgument for
  /// a null model or optimizer.
  Checkpointable(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
                 std::shared_ptr<comm::Communicator> communicator = nullptr);
  /// The same over a DistributedOptimizer, whose communicator it uses and whose sharded
  /// state (ReducerOptions::shardOptimizer) it makes whole before saving.
  Checkpointable(std::shared_ptr<nn::Module> model,
                 std::shared_ptr<parallel::DistributedOptimizer> optimizer);

  /// Rank 0: the model's state dict (parameters and buffers), the optimizer's kind and
  /// state; other ranks: nothing. Blocking; collective over the communicator (a
  /// DistributedOptimizer's state is consolidated first).
  StateDict stateDict() override;
  /// Rank 0 copies the checkpoint's weights into the model (by name, every tensor, shapes
  /// alike) and its optimizer state into the optimizer; every rank learns whether it could,
  /// then rank 0's parameters, buffers and optimizer state are broadcast. Blocking;
  /// collective. Throws on every rank alike: InvalidArgument naming the tensors that differ,
  /// Mismatch for another optimizer kind or none saved (a PeerError naming rank 0 on the
  /// others).
  void loadStateDict(const StateDict& state) override;

 private:
  optim::Optimizer& optimizer();
  int rank() const;

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<parallel::DistributedOptimizer> distributed_;
  std::shared_ptr<comm::Communicator> communicator_;
};

}  // namespace kolo::train
