// Hybrid parallelism: the job's ranks as a grid of data-parallel replicas × model groups (a
// pipeline's stages or a tensor-parallel group), built with Communicator::split. Each model
// group trains on its share of the global batch; gradients are averaged inside the data
// groups only (the ranks holding the same part of the model), then every rank steps.
#pragma once

#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"

namespace kolo::parallel {

/// `--mesh dp=D,pp=P` or `dp=D,tp=T` (any order; a missing size is 1).
struct MeshShape {
  int dp = 1, pp = 1, tp = 1;
  int size() const { return dp * pp * tp; }
};
/// Parses "dp=2,pp=2"; throws InvalidArgument naming the text for another key, a size below
/// 1, or both pp and tp above 1 (data × pipeline × tensor is not built).
MeshShape parseMeshShape(const std::string& text);

struct MeshGroups {
  /// The ranks holding the parts of one replica of the model (model group d = world ranks
  /// d·m … d·m + m − 1, m = pp·tp), ordered by world rank.
  std::shared_ptr<comm::Communicator> model;
  /// The ranks holding the same part in every replica (size dp), ordered by replica.
  std::shared_ptr<comm::Communicator> data;
  int replica = 0;  // d: this rank's data-parallel index
};

/// Collective over `world`: splits it into the groups of `shape`. Throws InvalidArgument
/// when world's size is not shape.size().
MeshGroups makeMesh(comm::Communicator& world, const MeshShape& shape);

/// Averages every parameter's gradient of `module` over `data` (one all-reduce of the
/// gradients packed together). Blocking, collective over `data`; a parameter without a
/// gradient counts as zeros.
void averageGradients(const nn::Module& module, comm::Communicator& data);

}  // namespace kolo::parallel
