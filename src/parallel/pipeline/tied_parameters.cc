// Tied parameters across pipeline stages: found from shared tensors, their gradients summed
// between the two stages that hold copies (Megatron-LM's embedding group).
#include "kolo/parallel/tied_parameters.h"

#include <algorithm>
#include <map>

#include "kolo/ops.h"

namespace kolo::parallel {

namespace {

constexpr int kTiedTag = 7190;

// The stage holding the layer that `name` belongs to: its first component is a child's name
// (a Sequential's children may be named by the caller) or its index.
int stageOf(const std::string& name, const std::vector<int>& bounds, const std::vector<std::string>& layerNames) {
  const std::string layer = name.substr(0, name.find('.'));
  int index = -1;
  const auto named = std::find(layerNames.begin(), layerNames.end(), layer);
  if (named != layerNames.end()) {
    index = static_cast<int>(named - layerNames.begin());
  } else if (!layer.empty() && layer.find_first_not_of("0123456789") == std::string::npos) {
    try {
      index = std::stoi(layer);
    } catch (const std::exception&) {
    }
  }
  for (size_t s = 0; index >= 0 && s + 1 < bounds.size(); ++s)
    if (index >= bounds[s] && index < bounds[s + 1]) return static_cast<int>(s);
  KOLO_THROW(InvalidArgument, "pipeline: the tied parameter '", name,
             "' does not name a layer of the model (its first component must be a layer's name or its index inside [0, ",
             bounds.back(), "))");
}

}  // namespace

std::vector<TiedParameter> tiedParameters(const nn::Module& model) {
  std::vector<TiedParameter> ties;
  std::map<const TensorImpl*, std::string> firstName;
  for (const auto& [name, tensor] : model.stateDict()) {
    if (!tensor.requiresGrad()) continue;
    const auto [at, inserted] = firstName.emplace(tensor.impl(), name);
    if (!inserted) ties.push_back({at->second, name});
  }
  return ties;
}

TiedGradients::TiedGradients(std::shared_ptr<comm::Communicator> pipeline, std::vector<int> bounds, int stage,
                             const nn::Module& stageModule, const std::vector<TiedParameter>& ties,
                             const std::vector<std::string>& layerNames)
    : pipeline_(std::move(pipeline)) {
  std::map<std::string, Tensor> mine;
  for (const auto& [name, tensor] : stageModule.stateDict()) mine.emplace(name, tensor);
  for (const TiedParameter& tie : ties) {
    const int a = stageOf(tie.first, bounds, layerNames), b = stageOf(tie.second, bounds, layerNames);
    if (a == b || (stage != a && stage != b)) continue;
    const std::string& name = stage == a ? tie.first : tie.second;
    const auto found = mine.find(name);
    KOLO_REQUIRE(found != mine.end(), "pipeline: stage ", stage, " holds no parameter '", name,
                 "', which is tied to '", stage == a ? tie.second : tie.first, "'");
    KOLO_REQUIRE(pipeline_ != nullptr, "pipeline: tied parameters on two stages need the pipeline's communicator");
    copies_.push_back({found->second, stage == a ? b : a});
  }
}

void TiedGradients::sum() {
  for (Copy& copy : copies_) {
    Tensor grad = copy.parameter.grad();
    KOLO_CHECK(grad.defined(), "pipeline: the tied parameter ", copy.parameter.name(), " has no gradient");
    // Both sides send theirs and add the other's: a + b and b + a are the same floats.
    Tensor mine = grad.contiguous().clone(), theirs = Tensor::empty(mine.shape(), mine.dtype());
    auto send = pipeline_->isend(mine.rawData(), static_cast<size_t>(mine.numel()), mine.dtype(), copy.peer,
                                 kTiedTag);
    pipeline_->recv(theirs.rawData(), static_cast<size_t>(theirs.numel()), theirs.dtype(), copy.peer, kTiedTag);
    send->wait();
    grad.copyFrom(mine + theirs);
  }
}

}  // namespace kolo::parallel
