// The examples' data: Fashion-MNIST's split as the Debian package dataset-fashion-mnist
// installs it, or, where it is not installed, a synthetic stand-in of its shape whose labels
// are a fixed linear map of the inputs (so there is something to learn).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "kolo/data.h"
#include "kolo/ops.h"

// The training split (its first `trainSamples`, 0: all) or the test split (its first
// `testSamples`) of the Fashion-MNIST files in `dir`; without them, 4096 or 1024 synthetic
// samples of 784 values in [0, 1) and 10 classes, the same on every rank.
inline std::shared_ptr<kolo::data::TensorDataset> loadSplit(const std::string& dir, bool train,
                                                            int64_t trainSamples = 20000, int64_t testSamples = 0) {
  if (std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz"))
    return std::make_shared<kolo::data::FashionMnist>(dir, train, train ? trainSamples : testSamples);
  const int64_t n = train ? 4096 : 1024;
  kolo::Generator gen(train ? 7 : 8);
  kolo::Tensor inputs = kolo::Tensor::rand({n, 784}, gen);
  kolo::Generator mapGen(9);
  kolo::Tensor map = kolo::Tensor::rand({784, 10}, mapGen, -1.0, 1.0);
  kolo::Tensor labels = kolo::argmax(kolo::matmul(inputs, map), 1);
  return std::make_shared<kolo::data::TensorDataset>(inputs, labels);
}
