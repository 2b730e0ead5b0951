// BatchContract: a user's dataset named as the culprit when its batches break the contract.
#include "train/batch_contract.h"

#include <exception>

#include "kolo/error.h"
#include "tensor/label_error.h"

namespace kolo::train::detail {
namespace {

bool floating(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }

std::string indexText(const data::Batch& batch) {
  return batch.indices.empty() ? std::string("?") : std::to_string(batch.indices.front());
}

}  // namespace

void BatchContract::check(const data::Batch& batch) {
  const auto rows = static_cast<int64_t>(batch.indices.size());
  const std::string where = dataset_ + " (a data::Dataset's gather of " + std::to_string(rows) +
                            " indices from index " + indexText(batch) + ")";
  KOLO_REQUIRE(batch.inputs.defined() && batch.inputs.dim() >= 1, where, " returned no inputs");
  KOLO_REQUIRE(batch.labels.defined() && batch.labels.dim() >= 1, where, " returned no labels");
  KOLO_REQUIRE(batch.inputs.shape()[0] == rows, where, " returned inputs of shape ",
               shapeString(batch.inputs.shape()), ": one row per index is the contract");
  KOLO_REQUIRE(batch.labels.shape()[0] == rows, where, " returned labels of shape ",
               shapeString(batch.labels.shape()), ": one per index is the contract");
  const Shape sample(batch.inputs.shape().begin() + 1, batch.inputs.shape().end());
  if (!inputs_) {
    if (weights_ && floating(batch.inputs.dtype()) && floating(*weights_))
      KOLO_REQUIRE(batch.inputs.dtype() == *weights_, where, " returned ",
                   dtypeName(batch.inputs.dtype()), " inputs, but the model's parameters are ",
                   dtypeName(*weights_), ": a dataset gives inputs in the model's dtype");
    inputs_ = batch.inputs.dtype();
    labels_ = batch.labels.dtype();
    sample_ = sample;
    return;
  }
  KOLO_REQUIRE(batch.inputs.dtype() == *inputs_ && sample == sample_, where, " returned ",
               dtypeName(batch.inputs.dtype()), " inputs of samples ", shapeString(sample),
               ", earlier batches ", dtypeName(*inputs_), " of ", shapeString(sample_),
               ": every batch of a dataset has the same dtype and sample shape");
  KOLO_REQUIRE(batch.labels.dtype() == *labels_, where, " returned ", dtypeName(batch.labels.dtype()),
               " labels, earlier batches ", dtypeName(*labels_));
}

void BatchContract::rethrowNamingTheLabel(const data::Batch& batch) const {
  try {
    throw;
  } catch (const ::kolo::detail::LabelOutOfRange& error) {
    // The kernel knows a row of its input, which a replica's share may offset: the label's
    // value finds the dataset index whatever the split.
    const Tensor labels = batch.labels.contiguous();
    const std::vector<double> values = labels.toDoubleVector();
    for (size_t i = 0; i < values.size() && i < batch.indices.size(); ++i) {
      if (static_cast<int64_t>(values[i]) != error.label()) continue;
      KOLO_THROW(InvalidArgument, dataset_, "'s label ", error.label(), " at index ",
                 batch.indices[i], " is outside the model's ", error.classes(), " classes [0, ",
                 error.classes(), "): a dataset's labels must be class indices");
    }
    throw;
  }
}

}  // namespace kolo::train::detail
