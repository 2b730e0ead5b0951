// What the train layer's tests share: a dataset with something to learn, the SGD they train
// with, the quiet fit they run, a model's weights flattened, their largest difference, and a fresh directory.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kolo/data.h"
#include "kolo/observe.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/strategy.h"
#include "kolo/train/fit.h"

namespace kolo::train::testing {

/// A fit of `steps` steps at global batch `batch` and seed 5 that prints nothing (warnings go
/// to `logger`) and prefetches nothing, as the equivalence tests run it.
inline FitOptions quietFit(int64_t batch, int64_t steps, observe::Logger& logger) {
  FitOptions fit;
  fit.batch = batch;
  fit.seed = 5;
  fit.quiet = true;
  fit.logger = &logger;
  fit.prefetch = 0;
  fit.steps = steps;
  return fit;
}

/// `n` samples of `features` normal inputs, labelled by the argmax of a fixed linear map into
/// `classes` (seeded apart from the inputs), so that there is something to learn.
inline std::shared_ptr<data::TensorDataset> linearDataset(int64_t n, uint64_t seed, int64_t features,
                                                          int64_t classes) {
  Generator gen(seed);
  Tensor inputs = Tensor::randn({n, features}, gen);
  Generator mapGen(99);
  Tensor map = Tensor::randn({features, classes}, mapGen);
  return std::make_shared<data::TensorDataset>(inputs, argmax(matmul(inputs, map), 1));
}

/// `n` samples of `features` normal inputs (seed 1), labelled by which of the first `classes`
/// features is the largest: learnable by any small model.
inline std::shared_ptr<data::TensorDataset> argmaxDataset(int64_t n, int64_t features,
                                                          int64_t classes) {
  Generator gen(1);
  Tensor inputs = Tensor::randn({n, features}, gen);
  return std::make_shared<data::TensorDataset>(inputs, argmax(inputs.slice(1, 0, classes), 1));
}

/// SGD with lr 0.1 and momentum 0.9.
inline std::unique_ptr<optim::Optimizer> sgd(const parallel::NamedTensors& parameters) {
  return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
}

/// Every tensor of `module`'s state dict, in its order, flattened into one vector.
inline std::vector<float> weights(nn::Module& module) {
  std::vector<float> out;
  for (const auto& [name, tensor] : module.stateDict()) {
    const std::vector<float> values = tensor.toFloatVector();
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

/// The largest element-wise difference of two equally long vectors.
inline double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

/// TMPDIR/<prefix>_<name>_<pid>, emptied (not created).
inline std::string freshDir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

}  // namespace kolo::train::testing
