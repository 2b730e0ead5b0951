// kolo::save / kolo::load of a module: its stateDict() as one safetensors file.
#include "kolo/serialize.h"

#include "kolo/safetensors.h"

namespace kolo {

void save(const nn::Module& module, const std::string& path) {
  checkpoint::saveSafetensors(path, module.stateDict());
}

void load(nn::Module& module, const std::string& path) {
  module.loadStateDict(checkpoint::loadSafetensors(path).tensors, path);
}

}  // namespace kolo
