// What train::evaluate and the engines that evaluate in their own way share: a dataset's rows
// as a batch, and the count of correct argmax predictions.
#pragma once

#include <cstdint>

#include "kolo/data.h"
#include "kolo/tensor.h"

namespace kolo::train::detail {

/// Rows [from, to) of the dataset: views of a TensorDataset, gathered otherwise.
data::Batch datasetRows(const data::Dataset& dataset, int64_t from, int64_t to);

/// Whether `output` holds one row of class scores per label: (..., C) against labels (...).
bool scoresPerLabel(const Tensor& output, const Tensor& labels);

/// The index of the largest of `width` scores (the first of equal ones).
int64_t argmaxOf(const float* scores, int64_t width);

/// Correct argmax predictions of `output` (..., C) against integer `labels` (...); the first
/// of equal scores wins.
int64_t countCorrect(const Tensor& output, const Tensor& labels);

}  // namespace kolo::train::detail
