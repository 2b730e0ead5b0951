// What fit checks of the batches a user's dataset gives, so that a dataset that breaks the
// data::Dataset contract is named as the dataset's fault, with the dataset's indices, rather
// than as a failed check inside a kernel: one row of inputs and labels per index, the same
// dtype and sample shape in every batch, inputs in the model's floating dtype, and class
// labels within the model's classes.
#pragma once

#include <optional>
#include <string>

#include "kolo/data.h"
#include "kolo/tensor.h"

namespace kolo::train::detail {

/// Checks the batches of one dataset against the first one it gave. Not thread-safe.
class BatchContract {
 public:
  /// `dataset`: how messages name it ("the training set"); `weights`: the dtype of the
  /// model's parameters (inputs of another floating dtype are refused; unset: no check).
  BatchContract(std::string dataset, std::optional<DType> weights)
      : dataset_(std::move(dataset)), weights_(weights) {}
  /// Throws InvalidArgument naming the dataset and the first index of `batch` when its
  /// tensors do not fit the contract.
  void check(const data::Batch& batch);
  /// Turns crossEntropy's label error while training on `batch` into one that names the
  /// dataset index whose label it is; other exceptions are rethrown as they are. Call it in
  /// a catch block.
  [[noreturn]] void rethrowNamingTheLabel(const data::Batch& batch) const;

 private:
  std::string dataset_;
  std::optional<DType> weights_;
  std::optional<DType> inputs_, labels_;
  Shape sample_;
};

}  // namespace kolo::train::detail
