// Batch normalisation modules with PyTorch's names and semantics: BatchNorm (torch's
// _BatchNorm, the module both share) with BatchNorm1d over (N, C) or (N, C, L) and BatchNorm2d
// over (N, C, H, W). A group sum makes one synchronised (SyncBatchNorm): the statistics are
// then the data-parallel group's global batch's (parallel::convertSyncBatchNorm sets it).
#pragma once

#include <string>
#include <vector>

#include "kolo/nn/module.h"
#include "kolo/ops.h"

namespace kolo::nn {

/// Normalises each channel of its input (dimension 1). Training mode normalises with the
/// batch's mean and biased variance and moves the running estimates: running = (1 -
/// momentum) running + momentum batch, the variance unbiased, and counts the batch in
/// num_batches_tracked; eval mode normalises with the running estimates. Parameters
/// "weight" (ones) and "bias" (zeros); buffers "running_mean" (zeros), "running_var" (ones)
/// and "num_batches_tracked" (i64, shape {}), in PyTorch's state_dict order. Throws
/// InvalidArgument for an input whose rank or channel count the module does not take, or for
/// one value per channel in training mode.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x) + residual), or relu(forward(x)) with residual undefined, as one op
  /// (kolo::batchNormRelu): the same values, running statistics and batch count as those
  /// steps. Hooks on this module do not run; a caller fuses only where hasHooks() is false.
  Tensor forwardRelu(const Tensor& x, const Tensor& residual = Tensor());
  /// Synchronised batch norm: in training mode each forward's statistics (and its backward's
  /// sums) are summed over a data-parallel group through `groupSum` (kolo::batchNorm), so
  /// that every replica normalises with the global batch's statistics and the running
  /// estimates agree everywhere. An empty function: this replica's batch alone (the
  /// default). Every replica of the group must set it alike.
  void setGroupSum(GroupSum groupSum) { groupSum_ = std::move(groupSum); }
  bool synchronized() const { return static_cast<bool>(groupSum_); }
  int64_t numFeatures() const { return numFeatures_; }

  Tensor weight, bias;
  Tensor runningMean, runningVar, numBatchesTracked;

 protected:
  /// `kind` names the module in errors ("BatchNorm2d"); `ranks` are the input ranks it takes.
  BatchNorm(std::string kind, std::vector<int64_t> ranks, int64_t numFeatures, double eps, double momentum);

 private:
  // Throws InvalidArgument for an input this module does not take.
  void checkInput(const Tensor& x) const;

  std::string kind_;
  std::vector<int64_t> ranks_;
  int64_t numFeatures_;
  double eps_, momentum_;
  GroupSum groupSum_;
};

/// torch.nn.BatchNorm1d: inputs (N, C) or (N, C, L).
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t numFeatures, double eps = 1e-5, double momentum = 0.1)
      : BatchNorm("BatchNorm1d", {2, 3}, numFeatures, eps, momentum) {}
};

/// torch.nn.BatchNorm2d: inputs (N, C, H, W).
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t numFeatures, double eps = 1e-5, double momentum = 0.1)
      : BatchNorm("BatchNorm2d", {4}, numFeatures, eps, momentum) {}
};

}  // namespace kolo::nn
