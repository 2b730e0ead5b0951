// Hybrid parallelism: the job's ranks as a grid of data-parallel replicas × model groups (a
// pipeline's stages, a tensor-parallel group, or pipeline stages each split over a tensor
// group), built with Communicator::split. Each model group trains on its share of the global
// batch; gradients are averaged inside the data groups only (the ranks holding the same part
// of the model), then every rank steps. Also: the whole model's tensors gathered from the
// parts a model group holds (checkpoints, the final weights).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/parallel/tensor_parallel.h"

namespace kolo::parallel {

/// `--mesh dp=D,pp=P,tp=T` (any order; a missing size is 1).
struct MeshShape {
  int dp = 1, pp = 1, tp = 1;
  int size() const { return dp * pp * tp; }
};
/// Parses "dp=2,pp=2,tp=2"; throws InvalidArgument naming the text for another key or a size
/// below 1.
MeshShape parseMeshShape(const std::string& text);
/// Parses split points "3,6" (the first layer of stages 1, 2, …; ModelParallelOptions::splitAt);
/// throws InvalidArgument naming the text for anything but whole numbers.
std::vector<int> parseSplitPoints(const std::string& text);

/// World rank w = d·(pp·tp) + s·tp + t holds stage s (of pp) of replica d (of dp), and in it
/// tensor-parallel rank t (of tp): the tensor groups are neighbours (the heaviest traffic),
/// then the stages, then the replicas.
struct MeshGroups {
  /// The ranks holding the parts of one replica of the model (model group d = world ranks
  /// d·m … d·m + m − 1, m = pp·tp), ordered by world rank: rank s·tp + t.
  std::shared_ptr<comm::Communicator> model;
  /// The ranks holding the same part in every replica (size dp), ordered by replica.
  std::shared_ptr<comm::Communicator> data;
  /// The stages of this rank's replica with its tensor rank (size pp), ordered by stage.
  std::shared_ptr<comm::Communicator> pipeline;
  /// The tensor-parallel ranks of this rank's stage (size tp), ordered by t.
  std::shared_ptr<comm::Communicator> tensor;
  int replica = 0;  // d: this rank's data-parallel index
  int stage = 0;    // s
  int tensorRank = 0;  // t
};

/// Collective over `world`: splits it into the groups of `shape`. Throws InvalidArgument
/// when world's size is not shape.size().
MeshGroups makeMesh(comm::Communicator& world, const MeshShape& shape);

/// One tensor of a rank's part of the model under its whole-model name ("3.attn.qkv.weight",
/// "3.attn.qkv.weight/exp_avg"), with how it was cut from the whole tensor.
struct ModelPiece {
  std::string name;
  Tensor tensor;
  ShardSpec spec;  // replicated (dim < 0) or split over the tensor group
};

/// Collective over `group` (a model group: pipeline stages, tensor ranks, or both, each
/// stage's tensor ranks consecutive and in order): every rank sends its pieces to `root`,
/// which returns the whole tensors (split pieces of one name reassembled in rank order with
/// unshardTensor, replicated ones taken from the first rank holding them), in the order the
/// ranks hold them; the other ranks return nothing. Blocking.
std::vector<std::pair<std::string, Tensor>> gatherWholeTensors(
    comm::Communicator& group, const std::vector<ModelPiece>& pieces, int root = 0);

/// Collective over `comm`: every rank returns `root`'s `tensors` (names, shapes, dtypes and
/// values; what the other ranks pass is ignored), e.g. a checkpoint's whole tensors that each
/// rank then cuts its part from (pieceOfWhole). Blocking. Throws InvalidArgument on a rank
/// that receives a header out of bounds.
std::vector<std::pair<std::string, Tensor>> broadcastTensors(
    comm::Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& tensors,
    int root = 0);

/// `whole` cut as `spec` for tensor rank `rank` of `parts` (whole itself when replicated).
Tensor pieceOfWhole(const Tensor& whole, const ShardSpec& spec, int rank, int parts);

/// Averages every parameter's gradient of `module` over `data` (one all-reduce of the
/// gradients packed together). Blocking, collective over `data`; a parameter without a
/// gradient counts as zeros.
void averageGradients(const nn::Module& module, comm::Communicator& data);

}  // namespace kolo::parallel
