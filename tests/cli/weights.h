// A safetensors file's tensors as float vectors, sorted by name, for comparing the weights
// that different runs of kolo train saved.
#pragma once

#include <algorithm>
#include <cmath>
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

// Largest |reference - other| of a tensor over the largest |reference| of it.
inline double relativeDifference(const std::vector<float>& reference, const std::vector<float>& other) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(reference[i]) - other[i]));
    scale = std::max(scale, std::abs(static_cast<double>(reference[i])));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace kolo::testing
