// A parameter server's state in a file (server_state.h).
#include "parallel/ps/server_state.h"

#include <cstdio>
#include <map>

#include "kolo/error.h"
#include "kolo/safetensors.h"

namespace kolo::parallel::ps::detail {

void saveServerState(const std::string& path, int index, const NamedTensors& views,
                     optim::Optimizer& optimizer, int64_t version) {
  NamedTensors tensors;
  for (const auto& [slice, view] : views) tensors.emplace_back("value/" + slice, view);
  const optim::StateDict state = optimizer.stateDict();
  for (const auto& [slot, tensor] : state.flatTensors()) tensors.emplace_back("state/" + slot, tensor);
  // The rate of the last update, for the record (a resumed server takes the schedule's).
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.17g", optimizer.lr());
  std::map<std::string, std::string> metadata = {{"version", std::to_string(version)},
                                                 {"server", std::to_string(index)},
                                                 {"optimizer", optimizer.kind()},
                                                 {"lr", lr},
                                                 {"step", std::to_string(optimizer.stepCount())}};
  checkpoint::saveSafetensors(path, tensors, metadata);
}

int64_t restoreServerState(const std::string& path, int index, const NamedTensors& views,
                           optim::Optimizer& optimizer) {
  const checkpoint::SafetensorsFile file = checkpoint::loadSafetensors(path);
  const ServerStateFacts facts = checkServerStateMetadata(file.metadata, path, index, optimizer.kind());
  NamedTensors targets;
  for (const auto& [slice, view] : views) {
    targets.emplace_back("value/" + slice, view);
    if (!file.find("value/" + slice).defined())
      KOLO_THROW(Mismatch, path, " holds no values of ", slice,
                 ": it was written for another model, number of servers or "
                 "ParameterServerOptions::shardBytes");
  }
  checkpoint::copyIntoTensors(file, targets, false, path);
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto& [key, tensor] : file.tensors)
    if (key.rfind("state/", 0) == 0) state.emplace_back(key.substr(6), tensor);
  try {
    optimizer.loadStateDict(optim::StateDict::fromFlat(
        state, {{"step", static_cast<double>(facts.step)}, {"lr", optimizer.lr()}}));
  } catch (const InvalidArgument& e) {
    KOLO_THROW(FormatError, path, ": the optimizer state does not fit this server: ", e.what());
  }
  return facts.version;
}

}  // namespace kolo::parallel::ps::detail
