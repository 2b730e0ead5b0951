// train::evaluate: each rank's contiguous slice of the dataset in chunks, the sums of the
// loss and of the correct predictions all-reduced once.
#include "kolo/train/evaluate.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/ops.h"
#include "train/evaluate_parts.h"

namespace kolo::train {
namespace detail {

data::Batch datasetRows(const data::Dataset& dataset, int64_t from, int64_t to) {
  if (const auto* tensors = dynamic_cast<const data::TensorDataset*>(&dataset))
    return {tensors->inputs().slice(0, from, to), tensors->labels().slice(0, from, to), {}};
  std::vector<int64_t> indices(static_cast<size_t>(to - from));
  std::iota(indices.begin(), indices.end(), from);
  return dataset.gather(indices);
}

bool scoresPerLabel(const Tensor& output, const Tensor& labels) {
  return output.dtype() == DType::F32 && output.dim() >= 2 && labels.dim() == output.dim() - 1 &&
         labels.numel() * output.size(output.dim() - 1) == output.numel();
}

int64_t countCorrect(const Tensor& output, const Tensor& labels) {
  const Tensor logits = output.contiguous();
  const std::vector<double> classes = labels.toDoubleVector();
  const int64_t width = logits.size(logits.dim() - 1);
  const float* values = logits.data<float>();
  int64_t correct = 0;
  for (int64_t i = 0; i < labels.numel(); ++i)
    correct += argmaxOf(values + i * width, width) == static_cast<int64_t>(classes[static_cast<size_t>(i)]);
  return correct;
}

int64_t argmaxOf(const float* scores, int64_t width) {
  int64_t best = 0;
  for (int64_t c = 1; c < width; ++c)
    if (scores[c] > scores[best]) best = c;
  return best;
}

}  // namespace detail

EvaluateResult evaluate(nn::Module& model, const data::Dataset& dataset,
                        const EvaluateOptions& options) {
  KOLO_REQUIRE(options.batch >= 1, "train::evaluate: batch must be at least 1, got ",
               options.batch);
  const auto& comm = options.communicator;
  const int size = comm ? comm->size() : 1;
  const int rank = comm ? comm->rank() : 0;
  const int64_t n = dataset.size();
  const int64_t begin = n * rank / size;
  const int64_t end = n * (rank + 1) / size;
  autograd::NoGradGuard noGrad;
  model.train(false);
  // The loss summed over samples, correct predictions, and the predictions counted.
  double sums[3] = {0.0, 0.0, 0.0};
  for (int64_t from = begin; from < end; from += options.batch) {
    const int64_t to = std::min(from + options.batch, end);
    const data::Batch batch = detail::datasetRows(dataset, from, to);
    const Tensor output = model.forward(batch.inputs);  // (b, ..., C)
    const Tensor loss = options.loss ? options.loss(output, batch.labels)
                                     : crossEntropy(output, batch.labels);
    sums[0] += loss.item() * static_cast<double>(to - from);
    if (detail::scoresPerLabel(output, batch.labels)) {
      sums[1] += static_cast<double>(detail::countCorrect(output, batch.labels));
      sums[2] += static_cast<double>(batch.labels.numel());
    }
  }
  if (size > 1) {
    const double mine[3] = {sums[0], sums[1], sums[2]};
    comm->allreduce(mine, sums, 3, DType::F64, comm::ReduceOp::Sum);
  }
  EvaluateResult result;
  result.samples = n;
  if (n > 0) {
    result.loss = sums[0] / static_cast<double>(n);
    result.accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
  }
  return result;
}

}  // namespace kolo::train
