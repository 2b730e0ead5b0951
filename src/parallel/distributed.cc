// The Horovod-style entry points: init, parameter and optimizer-state broadcast, and the
// DistributedOptimizer that finalizes the Reducer before each update.
#include "kolo/parallel/distributed.h"

#include <nlohmann/json.hpp>

#include "kolo/error.h"

namespace kolo::parallel {

void broadcastParameters(const NamedTensors& parameters, comm::Communicator& comm, int root) {
  if (comm.size() == 1) return;
  for (const auto& [name, t] : parameters) {
    KOLO_CHECK(t.isContiguous(), "broadcastParameters: '", name, "' is not contiguous");
    comm.broadcast(const_cast<void*>(t.rawData()), static_cast<size_t>(t.numel()), t.dtype(), root);
  }
}

void broadcastParameters(const nn::Module& module, comm::Communicator& comm, int root) {
  broadcastParameters(module.stateDict(), comm, root);
}

optim::StateDict conformStateShapes(optim::StateDict state, const optim::Optimizer& optimizer) {
  for (const auto& [name, param] : optimizer.parameters()) {
    auto it = state.perParameter.find(name);
    if (it == state.perParameter.end()) continue;
    for (auto& [slot, t] : it->second)
      if (t.shape() != param.shape() && t.numel() == param.numel()) t = t.reshape(param.shape());
  }
  return state;
}

void broadcastOptimizerState(optim::Optimizer& optimizer, comm::Communicator& comm, int root) {
  if (comm.size() == 1) return;
  // Root describes its state (kind, scalars, slot names, shapes) as JSON; every rank then
  // receives each slot's data into a tensor of that shape.
  using nlohmann::json;
  optim::StateDict state;
  std::string text;
  if (comm.rank() == root) {
    state = optimizer.stateDict();
    json desc;
    desc["kind"] = optimizer.kind();
    desc["scalars"] = state.scalars;
    json slots = json::array();
    for (const auto& [name, t] : state.flatTensors())
      slots.push_back({{"name", name}, {"shape", t.shape()}, {"dtype", dtypeName(t.dtype())}});
    desc["slots"] = slots;
    text = desc.dump();
  }
  uint64_t length = text.size();
  comm.broadcast(&length, 1, DType::I64, root);
  text.resize(length);
  comm.broadcast(text.data(), length, DType::U8, root);
  const json desc = json::parse(text);
  if (desc.at("kind").get<std::string>() != optimizer.kind())
    KOLO_THROW(Mismatch, "broadcastOptimizerState: rank ", comm.rank(), " has a ", optimizer.kind(),
               " optimizer but root rank ", root, " has ", desc.at("kind").get<std::string>());
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto rootTensors =
      comm.rank() == root ? state.flatTensors() : std::vector<std::pair<std::string, Tensor>>{};
  size_t i = 0;
  for (const auto& slot : desc.at("slots")) {
    Tensor t = comm.rank() == root ? rootTensors[i].second.contiguous()
                                   : Tensor::empty(slot.at("shape").get<Shape>(),
                                                   parseDType(slot.at("dtype").get<std::string>()));
    comm.broadcast(t.rawData(), static_cast<size_t>(t.numel()), t.dtype(), root);
    tensors.emplace_back(slot.at("name").get<std::string>(), t);
    ++i;
  }
  if (comm.rank() != root) {
    auto received = optim::StateDict::fromFlat(
        tensors, desc.at("scalars").get<std::map<std::string, double>>());
    optimizer.loadStateDict(conformStateShapes(std::move(received), optimizer));
  }
}

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<optim::Optimizer> optimizer,
                                           std::shared_ptr<comm::Communicator> comm,
                                           ReducerOptions options)
    : optimizer_(std::move(optimizer)), comm_(std::move(comm)) {
  KOLO_CHECK(optimizer_ != nullptr, "DistributedOptimizer: no optimizer");
  KOLO_CHECK(comm_ != nullptr, "DistributedOptimizer: no communicator");
  reducer_ = std::make_unique<Reducer>(optimizer_->parameters(), comm_, options);
}

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<optim::Optimizer> optimizer,
                                           std::shared_ptr<comm::Communicator> comm,
                                           const nn::Module& model, ReducerOptions options)
    : optimizer_(std::move(optimizer)), comm_(std::move(comm)) {
  KOLO_CHECK(optimizer_ != nullptr, "DistributedOptimizer: no optimizer");
  KOLO_CHECK(comm_ != nullptr, "DistributedOptimizer: no communicator");
  reducer_ = std::make_unique<Reducer>(optimizer_->parameters(), comm_, options,
                                       model.namedBuffers());
}

void DistributedOptimizer::step() {
  reducer_->step(*optimizer_);
}

}  // namespace kolo::parallel
