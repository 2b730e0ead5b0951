// BatchNorm1d and BatchNorm2d: the module state (parameters, running statistics, the batch
// counter) around kolo::batchNorm (and batchNormRelu, its fusion with a residual and ReLU),
// which normalises and moves the running estimates.
#include "kolo/nn/batch_norm.h"

#include <algorithm>

#include "kolo/autograd.h"

namespace kolo::nn {

BatchNorm::BatchNorm(std::string kind, std::vector<int64_t> ranks, int64_t numFeatures, double eps, double momentum)
    : kind_(std::move(kind)), ranks_(std::move(ranks)), numFeatures_(numFeatures), eps_(eps), momentum_(momentum) {
  KOLO_REQUIRE(numFeatures > 0, kind_, "(", numFeatures, "): size must be positive");
  weight = registerParameter("weight", Tensor::ones({numFeatures}));
  bias = registerParameter("bias", Tensor::zeros({numFeatures}));
  runningMean = registerBuffer("running_mean", Tensor::zeros({numFeatures}));
  runningVar = registerBuffer("running_var", Tensor::ones({numFeatures}));
  numBatchesTracked = registerBuffer("num_batches_tracked", Tensor::zeros({}, DType::I64));
}

void BatchNorm::checkInput(const Tensor& x) const {
  const bool rankTaken = std::find(ranks_.begin(), ranks_.end(), x.dim()) != ranks_.end();
  KOLO_REQUIRE(rankTaken && x.size(1) == numFeatures_, kind_, "(", numFeatures_, "): input ",
               shapeString(x.shape()), " is not ", ranks_.front() == 4 ? "(N, C, H, W)" : "(N, C) or (N, C, L)",
               " with C = ", numFeatures_);
  const int64_t perChannel = x.numel() / numFeatures_;
  KOLO_REQUIRE(!isTraining() || groupSum_ || perChannel > 1, kind_,
               ": training needs more than one value per channel, input is ", shapeString(x.shape()));
}

Tensor BatchNorm::forward(const Tensor& x) {
  checkInput(x);
  Tensor y = batchNorm(x, weight, bias, runningMean, runningVar, isTraining(), momentum_, eps_, groupSum_);
  if (isTraining()) numBatchesTracked.data<int64_t>()[0] += 1;
  return y;
}

Tensor BatchNorm::forwardRelu(const Tensor& x, const Tensor& residual) {
  checkInput(x);
  Tensor y =
      batchNormRelu(x, residual, weight, bias, runningMean, runningVar, isTraining(), momentum_, eps_, groupSum_);
  if (isTraining()) numBatchesTracked.data<int64_t>()[0] += 1;
  return y;
}

}  // namespace kolo::nn
