// Evaluation of a model over a dataset, distributed over the ranks of a job: each rank
// takes a contiguous slice of the dataset, and the sums of the loss and of the correct
// predictions are all-reduced, so every rank returns the figures of the whole dataset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "kolo/comm/communicator.h"
#include "kolo/data.h"
#include "kolo/nn/module.h"
#include "kolo/tensor.h"

namespace kolo::train {

/// The loss of a batch from the model's output (B, C) and the labels (B): a scalar mean over
/// the batch. Default (an empty function): cross-entropy of the logits against class labels.
using OutputLoss = std::function<Tensor(const Tensor& output, const Tensor& labels)>;

struct EvaluateOptions {
  /// Samples per forward pass (the memory of one pass grows with it).
  int64_t batch = 1000;
  /// The loss reported; default cross-entropy.
  OutputLoss loss{};
  /// The ranks that share the work (null or one rank: this process evaluates it all). Every
  /// rank of it must call evaluate() with the same dataset.
  std::shared_ptr<comm::Communicator> communicator{};
};

/// Figures of a model over a whole dataset.
struct EvaluateResult {
  /// Mean loss per sample.
  double loss = 0.0;
  /// Fraction of the predictions whose argmax is their label: one per sample for outputs
  /// (B, C) against labels (B), one per position for sequences, (B, T, C) against (B, T)
  /// (a language model's next-token accuracy); 0 when the output has another shape.
  double accuracy = 0.0;
  /// Samples evaluated (the dataset's size).
  int64_t samples = 0;
};

/// Evaluates `model` over `dataset` without recording autograd and with the model in eval
/// mode (dropout off, batch norm on its running statistics); the model is left in eval mode.
/// Rank r of options.communicator takes samples [n·r/size, n·(r+1)/size). Blocking;
/// collective over the communicator (one all-reduce). Throws InvalidArgument for a batch
/// below 1, and what the model's forward or the loss throws (then the other ranks fail in
/// their all-reduce with a timeout naming this rank).
EvaluateResult evaluate(nn::Module& model, const data::Dataset& dataset,
                        const EvaluateOptions& options = {});

}  // namespace kolo::train
