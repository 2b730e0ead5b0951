// ParameterServerState: the servers' slices of the weights and of the optimizer state,
// assembled into whole tensors for train::save and split again for train::load. The servers
// exchange their parts as the files of their Checkpoint and Restore requests
// ("value/<slice>", "state/<slice>/<slot>", metadata version/optimizer/step/lr), in a
// staging directory that the chief removes afterwards.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "kolo/error.h"
#include "kolo/safetensors.h"
#include "kolo/train/parameter_server.h"
#include "parallel/ps/server_state.h"

namespace kolo::train {
namespace {

namespace ps = parallel::ps;

/// The name a server gives slice `s` of parameter `name` (a whole parameter keeps its own).
std::string sliceName(const ps::Placement& placement, const ps::Slice& s) {
  const std::string& name = placement.names[static_cast<size_t>(s.parameter)];
  const bool whole = s.begin == 0 && s.end == placement.sizes[static_cast<size_t>(s.parameter)];
  return whole ? name : name + "[" + std::to_string(s.begin) + ":" + std::to_string(s.end) + "]";
}

/// A directory of its own under `root`, removed when this object goes.
class StagingDirectory {
 public:
  explicit StagingDirectory(const std::string& root) {
    static std::atomic<int> counter{0};
    path_ = root + "/.ps-state-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::create_directories(path_);
  }
  ~StagingDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  StagingDirectory(const StagingDirectory&) = delete;
  StagingDirectory& operator=(const StagingDirectory&) = delete;
  const std::string& path() const { return path_; }
  std::string serverFile(int server) const {
    return path_ + "/server-" + std::to_string(server) + ".safetensors";
  }

 private:
  std::string path_;
};

/// Copies the flat f32 elements of `part` into [begin, end) of `whole` (contiguous f32).
void copyInto(Tensor& whole, int64_t begin, int64_t end, const Tensor& part,
              const std::string& what) {
  KOLO_CHECK_EQ(part.numel(), end - begin, "elements of ", what);
  const Tensor source = part.contiguous();
  std::memcpy(whole.data<float>() + begin, source.data<float>(),
              static_cast<size_t>(end - begin) * sizeof(float));
}

/// Elements [begin, end) of `whole` as a tensor of their own.
Tensor flatPart(const Tensor& whole, int64_t begin, int64_t end) {
  const Tensor source = whole.contiguous();
  Tensor part = Tensor::empty({end - begin});
  std::memcpy(part.data<float>(), source.data<float>() + begin,
              static_cast<size_t>(end - begin) * sizeof(float));
  return part;
}

const std::string& metadataOf(const checkpoint::SafetensorsFile& file, const std::string& key,
                              int server) {
  const auto it = file.metadata.find(key);
  if (it == file.metadata.end())
    KOLO_THROW(FormatError, "parameter server ", server, " wrote no '", key, "' in its state");
  return it->second;
}

/// The checkpoint's "ps_version": a non-negative decimal integer, the whole text.
int64_t parseCount(const std::string& text) {
  int64_t value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0)
    KOLO_THROW(FormatError, "the checkpoint's ps_version is '", text,
               "', not a count (a non-negative integer)");
  return value;
}

const Tensor& findWhole(const NamedTensors& tensors, const std::string& name,
                        const std::string& where) {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return tensor;
  KOLO_THROW(Mismatch, "the checkpoint holds no ", where, " '", name,
             "' of the servers' parameters");
}

}  // namespace

ParameterServerState::ParameterServerState(std::shared_ptr<ps::ServerGroup> servers,
                                           parallel::NamedTensors parameters, std::string staging,
                                           parallel::NamedTensors buffers)
    : servers_(std::move(servers)),
      parameters_(std::move(parameters)),
      staging_(std::move(staging)),
      buffers_(std::move(buffers)) {
  KOLO_REQUIRE(servers_ != nullptr, "ParameterServerState: no server group");
  KOLO_REQUIRE(parameters_.size() == servers_->placement().names.size(),
               "ParameterServerState: ", parameters_.size(), " parameters, the placement has ",
               servers_->placement().names.size());
}

StateDict ParameterServerState::stateDict() {
  const ps::Placement& placement = servers_->placement();
  const StagingDirectory staging(staging_);
  servers_->checkpoint(staging.path());
  StateDict state;
  std::vector<Tensor> weights;
  for (const auto& [name, parameter] : parameters_) weights.push_back(Tensor::empty(parameter.shape()));
  std::map<std::string, std::map<std::string, Tensor>> slots;
  int64_t version = -1, step = -1;
  double lr = 0.0;
  for (int s = 0; s < placement.servers; ++s) {
    const std::string path = staging.serverFile(s);
    const checkpoint::SafetensorsFile file = checkpoint::loadSafetensors(path);
    // Server 0's optimizer is the job's: the others must hold the same kind, at the same step.
    if (s == 0) {
      state.optimizerKind = metadataOf(file, "optimizer", s);
      lr = std::strtod(metadataOf(file, "lr", s).c_str(), nullptr);
    }
    const ps::detail::ServerStateFacts facts =
        ps::detail::checkServerStateMetadata(file.metadata, path, s, state.optimizerKind);
    if (s == 0) step = facts.step;
    if (facts.step != step)
      KOLO_THROW(Mismatch, "parameter server ", s, " has taken ", facts.step,
                 " optimizer steps, server 0 ", step);
    version = version < 0 ? facts.version : std::min(version, facts.version);
    for (const ps::Slice& slice : placement.slicesOf(s)) {
      const std::string part = sliceName(placement, slice);
      const auto p = static_cast<size_t>(slice.parameter);
      const Tensor values = file.find("value/" + part);
      if (!values.defined())
        KOLO_THROW(FormatError, "parameter server ", s, " wrote no values of ", part);
      copyInto(weights[p], slice.begin, slice.end, values, part);
      const std::string prefix = "state/" + part + "/";
      for (const auto& [key, tensor] : file.tensors) {
        if (key.rfind(prefix, 0) != 0) continue;
        const std::string slot = key.substr(prefix.size());
        auto [it, fresh] = slots[placement.names[p]].try_emplace(slot);
        // Elementwise slots (momentum, Adam's moments) are assembled from the slices; others
        // (Adam's per-parameter step) are the same in every slice and kept as they are.
        if (tensor.numel() != slice.size() || slice.size() == 1) {
          if (fresh) it->second = tensor.contiguous();
          continue;
        }
        if (fresh) it->second = Tensor::zeros(weights[p].shape());
        copyInto(it->second, slice.begin, slice.end, tensor, key);
      }
    }
  }
  for (size_t p = 0; p < parameters_.size(); ++p) {
    state.weights.emplace_back(parameters_[p].first, weights[p]);
    Tensor target = parameters_[p].second;
    std::memcpy(target.data<float>(), weights[p].data<float>(),
                static_cast<size_t>(weights[p].numel()) * sizeof(float));
  }
  for (const auto& [name, buffer] : buffers_) state.weights.emplace_back(name, buffer.clone());
  state.optimizer.perParameter = std::move(slots);
  state.optimizer.scalars = {{"step", static_cast<double>(step)}, {"lr", lr}};
  version_ = std::max<int64_t>(version, 0);
  state.metadata["ps_version"] = std::to_string(version_);
  return state;
}

void ParameterServerState::loadStateDict(const StateDict& state) {
  const ps::Placement& placement = servers_->placement();
  if (state.optimizerKind.empty())
    KOLO_THROW(Mismatch, "the checkpoint holds no optimizer state for the parameter servers");
  // The servers' version is their step count: a parameter-server checkpoint says it, another
  // strategy's optimizer took one step per update.
  const auto stepIt = state.optimizer.scalars.find("step");
  const int64_t step = stepIt == state.optimizer.scalars.end()
                           ? 0
                           : static_cast<int64_t>(stepIt->second);
  const auto versionIt = state.metadata.find("ps_version");
  const int64_t version = versionIt == state.metadata.end() ? step : parseCount(versionIt->second);
  const auto lrIt = state.optimizer.scalars.find("lr");
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.17g", lrIt == state.optimizer.scalars.end() ? 0.0 : lrIt->second);
  const StagingDirectory staging(staging_);
  for (int s = 0; s < placement.servers; ++s) {
    NamedTensors tensors;
    for (const ps::Slice& slice : placement.slicesOf(s)) {
      const std::string& name = placement.names[static_cast<size_t>(slice.parameter)];
      const std::string part = sliceName(placement, slice);
      const Tensor& whole = findWhole(state.weights, name, "weight");
      if (whole.numel() != placement.sizes[static_cast<size_t>(slice.parameter)])
        KOLO_THROW(Mismatch, "the checkpoint's ", name, " has ", whole.numel(),
                   " elements, the servers' ", placement.sizes[static_cast<size_t>(slice.parameter)]);
      tensors.emplace_back("value/" + part, flatPart(whole, slice.begin, slice.end));
      const auto slots = state.optimizer.perParameter.find(name);
      if (slots == state.optimizer.perParameter.end()) continue;
      for (const auto& [slot, tensor] : slots->second) {
        // Elementwise slots are split as the values are; others go to every slice whole.
        const bool elementwise = tensor.numel() == whole.numel() && whole.numel() > 1;
        tensors.emplace_back("state/" + part + "/" + slot,
                             elementwise ? flatPart(tensor, slice.begin, slice.end) : tensor);
      }
    }
    checkpoint::saveSafetensors(staging.serverFile(s), tensors,
                                {{"version", std::to_string(version)},
                                 {"server", std::to_string(s)},
                                 {"optimizer", state.optimizerKind},
                                 {"lr", lr},
                                 {"step", std::to_string(step)}});
  }
  servers_->restore(staging.path());
  version_ = version;
  for (auto& [name, buffer] : buffers_) {
    const auto it = std::find_if(state.weights.begin(), state.weights.end(),
                                 [&name](const auto& entry) { return entry.first == name; });
    if (it == state.weights.end())
      KOLO_THROW(Mismatch, "the checkpoint holds no buffer '", name,
                 "' of the model (a batch norm's running statistics)");
    if (it->second.numel() != buffer.numel())
      KOLO_THROW(Mismatch, "the checkpoint's ", name, " has ", it->second.numel(),
                 " elements, the model's ", buffer.numel());
    buffer.copyFrom(it->second.reshape(buffer.shape()));
  }
}

}  // namespace kolo::train
