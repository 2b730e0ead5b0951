// A safetensors file's tensors as float vectors, sorted by name, for comparing the weights
// that different runs of kolo train saved.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kolo/safetensors.h"

namespace kolo::testing {

using Weights = std::vector<std::pair<std::string, std::vector<float>>>;

inline Weights loadWeights(const std::string& path) {
  Weights weights;
  for (const auto& [name, tensor] : checkpoint::loadSafetensors(path).tensors)
    weights.emplace_back(name, tensor.toFloatVector());
  std::sort(weights.begin(), weights.end());
  return weights;
}

}  // namespace kolo::testing
