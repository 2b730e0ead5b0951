// Tests that read the Fashion-MNIST files skip, all with the same reason, where the dataset
// package is not installed: KOLO_SKIP_WITHOUT_FASHION_MNIST() at the top of the test body
// or of its fixture's SetUp().
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "kolo/data.h"

namespace kolo::testing {

/// True when both splits (images and labels) lie in data::kFashionMnistDir.
inline bool fashionMnistInstalled() {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/" + name)) return false;
  return true;
}

}  // namespace kolo::testing

/// Skips the current test (GTEST_SKIP, so only in a test body or SetUp()) with the reason
/// when Fashion-MNIST is absent.
#define KOLO_SKIP_WITHOUT_FASHION_MNIST()                                                     \
  if (::kolo::testing::fashionMnistInstalled()) {                                             \
  } else                                                                                      \
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << ::kolo::data::kFashionMnistDir \
                 << " (package dataset-fashion-mnist)"
