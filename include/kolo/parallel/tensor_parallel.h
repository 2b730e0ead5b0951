// Tensor parallelism (Megatron-LM style): single layers split over the T ranks of a
// communicator. A column-parallel Linear holds a block of the output features (identity
// forward, all-reduce of the input gradient backward); a row-parallel Linear holds a block of
// the input features (all-reduce of the output forward, identity backward); the transformer
// MLP is column- then row-parallel, attention is split by heads (each rank computes H/T heads;
// the output projection is row-parallel). Everything else (embeddings, norms, the lm head) is
// replicated: its inputs and output gradients are the same on every rank, so its gradients
// are too, and the ranks' copies never drift apart.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "kolo/comm/communicator.h"
#include "kolo/nn/layers.h"

namespace kolo::parallel {

/// Identity forward; the gradient is all-reduced (summed) over `comm` backward. Marks the
/// entry of a tensor-parallel region whose ranks each use x for a part of the output.
Tensor copyToTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// All-reduce (sum) forward; identity backward. Marks the exit of a region whose ranks each
/// hold a partial sum of the output.
Tensor reduceFromTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm);

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

/// A Sequential model run tensor-parallel over `comm` (T = comm->size() ranks). Built from
/// the whole model (every rank builds it from the same seed): each rank copies its shards,
/// so training starts from the whole model's weights. Parameters keep the whole model's
/// names ("1.attn.qkv.weight", a shard of it). Splits: TransformerBlock (attention by heads,
/// MLP column- then row-parallel); in a run of Linear layers separated only by element-wise
/// layers (the mlp's Linear-ReLU-Linear), pairs of Linears column- then row-parallel; every
/// other layer replicated.
class TensorParallelModel : public nn::Module {
 public:
  /// Throws InvalidArgument when a split size (heads, features) is not divisible by T.
  TensorParallelModel(const nn::Sequential& whole, std::shared_ptr<comm::Communicator> comm);
  using Module::forward;
  Tensor forward(const Tensor& x) override;

  /// The split of each parameter, by its (whole-model) name.
  const std::map<std::string, ShardSpec>& shardSpecs() const { return specs_; }
  /// Collective: writes every parameter, whole, into `whole` on rank `root` (null elsewhere).
  void gatherInto(nn::Module* whole, int root = 0);
  int tensorParallelSize() const { return comm_->size(); }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  std::map<std::string, ShardSpec> specs_;
};

}  // namespace kolo::parallel
