// Checkpointable: a model and its optimizer saved from rank 0 and loaded on rank 0, then
// broadcast, for a training loop of one's own (train/checkpointable.h).
#include "kolo/train/checkpointable.h"

#include "kolo/error.h"
#include "kolo/safetensors.h"
#include "train/rank_zero.h"

namespace kolo::train {

Checkpointable::Checkpointable(std::shared_ptr<nn::Module> model,
                               std::shared_ptr<optim::Optimizer> optimizer,
                               std::shared_ptr<comm::Communicator> communicator)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), communicator_(std::move(communicator)) {
  KOLO_REQUIRE(model_ != nullptr, "Checkpointable: no model");
  KOLO_REQUIRE(optimizer_ != nullptr, "Checkpointable: no optimizer");
}

Checkpointable::Checkpointable(std::shared_ptr<nn::Module> model,
                               std::shared_ptr<parallel::DistributedOptimizer> optimizer)
    : model_(std::move(model)), distributed_(std::move(optimizer)) {
  KOLO_REQUIRE(model_ != nullptr, "Checkpointable: no model");
  KOLO_REQUIRE(distributed_ != nullptr, "Checkpointable: no optimizer");
}

optim::Optimizer& Checkpointable::optimizer() {
  return distributed_ ? distributed_->optimizer() : *optimizer_;
}

int Checkpointable::rank() const {
  if (distributed_) return distributed_->communicator().rank();
  return communicator_ ? communicator_->rank() : 0;
}

StateDict Checkpointable::stateDict() {
  if (distributed_) distributed_->consolidateState();  // collective: sharded slots made whole
  StateDict state;
  if (rank() != 0) return state;
  state.weights = model_->stateDict();
  state.optimizerKind = optimizer().kind();
  state.optimizer = optimizer().stateDict();
  return state;
}

void Checkpointable::loadStateDict(const StateDict& state) {
  comm::Communicator* comm = distributed_ ? &distributed_->communicator() : communicator_.get();
  // Rank 0 loads and tells every rank whether it could before any state moves.
  detail::loadOnRankZero(comm, rank(), [&] {
    checkpoint::copyIntoTensors(checkpoint::SafetensorsFile{state.weights, {}}, model_->stateDict(),
                                true, "the checkpoint's weights");
    if (state.optimizerKind != optimizer().kind())
      KOLO_THROW(Mismatch, "Checkpointable: the checkpoint holds ",
                 state.optimizerKind.empty() ? std::string("no") : state.optimizerKind,
                 " optimizer state, this loop's optimizer is ", optimizer().kind());
    optimizer().loadStateDict(parallel::conformStateShapes(state.optimizer, optimizer()));
  }, "load the checkpoint");
  if (comm && comm->size() > 1) {
    parallel::broadcastParameters(*model_, *comm, 0);
    parallel::broadcastOptimizerState(optimizer(), *comm, 0);
  }
}

}  // namespace kolo::train
