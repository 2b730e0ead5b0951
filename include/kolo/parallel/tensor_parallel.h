// Tensor parallelism (Megatron-LM style): single layers split over the T ranks of a
// communicator. A column-parallel Linear holds a block of the output features (identity
// forward, all-reduce of the input gradient backward); a row-parallel Linear holds a block of
// the input features (all-reduce of the output forward, identity backward); the transformer
// MLP is column- then row-parallel, attention is split by heads (each rank computes H/T heads;
// the output projection is row-parallel). The lm's token embedding and output head are split
// by vocabulary (each rank holds V/T rows; the loss is a vocabulary-parallel cross-entropy).
// With sequence parallelism the LayerNorms and the residual stream between the split layers
// hold seq/T of the tokens on each rank: an all-gather of the tokens replaces the identity
// before each column-parallel Linear, a reduce-scatter the all-reduce after each row-parallel
// one. Everything else is replicated: its inputs and output gradients are the same on every
// rank, so its gradients are too, and the ranks' copies never drift apart.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/layers.h"

namespace kolo::parallel {

/// Identity forward; the gradient is all-reduced (summed) over `comm` backward. Marks the
/// entry of a tensor-parallel region whose ranks each use x for a part of the output.
Tensor copyToTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// All-reduce (sum) forward; identity backward. Marks the exit of a region whose ranks each
/// hold a partial sum of the output.
Tensor reduceFromTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm);

/// All-gather of the tokens forward, reduce-scatter (sum) of the gradient backward: each
/// rank's x (B, t, ...) holds tokens rank·t ... rank·t + t − 1; the result (B, T·t, ...) all
/// of them, in order. Enters a column-parallel layer from a sequence-parallel region.
Tensor gatherSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// Reduce-scatter (sum) of the tokens forward, all-gather of the gradient backward: x (B, S,
/// ...) holds partial sums on every rank; the result (B, S/T, ...) rank r's tokens of the sum.
/// Leaves a row-parallel layer into a sequence-parallel region. Throws InvalidArgument when
/// T does not divide S.
Tensor scatterSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm);

/// The mean cross-entropy of logits split by vocabulary: this rank's logits (..., V/T) are the
/// classes rank·V/T ... (rank+1)·V/T − 1, targets (...) hold whole class ids. The row maxima,
/// the sums of exponentials and the target logits are all-reduced over `comm`, so no rank
/// holds the whole logits; the gradient (softmax − one-hot) stays split. Collective forward
/// (three all-reduces); backward is local. f32 logits; throws InvalidArgument for shapes that
/// do not match.
Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                 std::shared_ptr<comm::Communicator> comm);

/// Rank `rank`'s part of `full` split into `parts` along `dim`, where the dimension is made of
/// `blocks` equal blocks split separately (qkv's q, k and v blocks: blocks = 3): the part
/// concatenates, for every block, its rank-th slice. Throws InvalidArgument when the sizes
/// do not divide.
Tensor shardTensor(const Tensor& full, int dim, int blocks, int rank, int parts);

/// How one parameter of a tensor-parallel model relates to the whole model's: split along
/// `dim` in `blocks` blocks (see shardTensor), or replicated (dim < 0).
struct ShardSpec {
  int dim = -1;
  int blocks = 1;
};

/// The inverse of shardTensor: the whole tensor from every rank's part, in rank order.
Tensor unshardTensor(const std::vector<Tensor>& parts, int dim, int blocks);

struct TensorParallelOptions {
  /// Sequence-parallel regions (--sequence-parallel): the lm only; the sequence length must
  /// be a multiple of T.
  bool sequenceParallel = false;
};

/// A Sequential model run tensor-parallel over `comm` (T = comm->size() ranks), itself a
/// Sequential with the whole model's layer names (so a pipeline stage can cut it). Built from
/// the whole model (every rank builds it from the same seed), or from a part of it with empty
/// placeholders (makeLanguageModelPart): each rank copies its shards, so training starts from
/// the whole model's weights. Parameters keep the whole model's names ("1.attn.qkv.weight", a
/// shard of it). Splits: TokenPositionEmbedding (token table by vocabulary), TransformerBlock
/// (attention by heads, MLP column- then row-parallel), LanguageModelHead (by vocabulary: the
/// output is split, see loss()); in a run of Linear layers separated only by element-wise
/// layers (the mlp's Linear-ReLU-Linear), pairs of Linears column- then row-parallel; every
/// other layer replicated. With options.sequenceParallel the top-level LayerNorms take seq/T
/// of the tokens (their gradients all-reduced backward), and so does every layer boundary
/// between the embedding and the head.
class TensorParallelModel : public nn::Sequential {
 public:
  /// Throws InvalidArgument when a split size (heads, features, vocabulary) is not divisible
  /// by T, or with sequenceParallel for a layer that cannot take part of the tokens.
  TensorParallelModel(const nn::Sequential& whole, std::shared_ptr<comm::Communicator> comm,
                      TensorParallelOptions options = {});

  /// The mean cross-entropy of this model's output against targets (class ids, one per row
  /// of the output's last dimension): vocabParallelCrossEntropy when the output is split by
  /// vocabulary (the lm's head), the ordinary cross-entropy otherwise. Collective then.
  Tensor loss(const Tensor& output, const Tensor& targets);
  /// Whether forward's output holds V/T of the classes (the model ends in a LanguageModelHead).
  bool outputSplitByVocabulary() const { return vocabularyOutput_; }

  /// The split of each parameter, by its (whole-model) name.
  const std::map<std::string, ShardSpec>& shardSpecs() const { return specs_; }
  /// Collective: writes every parameter, whole, into `whole` on rank `root` (null elsewhere).
  void gatherInto(nn::Module* whole, int root = 0);
  int tensorParallelSize() const { return comm_->size(); }
  const std::shared_ptr<comm::Communicator>& communicator() const { return comm_; }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  std::map<std::string, ShardSpec> specs_;
  bool vocabularyOutput_ = false;
};

}  // namespace kolo::parallel
