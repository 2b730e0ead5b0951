// Hierarchical all-reduce for groups spread over several hosts. With a "rail" per local
// index (hosts of equal size): reduce-scatter inside each host, all-reduce of each block
// among the ranks holding it on every host, all-gather inside each host: every local rank
// carries its share of the inter-host traffic. Otherwise: reduce to one leader per host,
// all-reduce among leaders, broadcast inside each host. Either way one vector per host,
// not one per rank, crosses the network.
#pragma once

#include <cstddef>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// How a rank sees the two levels. The caller builds both groups (e.g. with split: color =
/// host for `local`; color = 0 on local roots and -1 elsewhere for `leaders`).
struct HierarchicalGroups {
  /// The ranks on this rank's host, this rank included. Required.
  Links* local = nullptr;
  /// One rank per host, ordered the same way on every leader; non-null exactly on the
  /// rank whose local rank is localRoot.
  Links* leaders = nullptr;
  /// Local rank acting as this host's leader (the same on every rank of the host).
  int localRoot = 0;
  /// Size of the whole group (Avg divides by it). Required, >= 1.
  int worldSize = 0;
  /// Algorithm among leaders (or along a rail): Auto, Ring, HalvingDoubling, Tree or
  /// ReduceBroadcast.
  Algorithm leaderAlgorithm = Algorithm::Auto;
  /// Optional, and then set on every rank of every host: the ranks with this rank's local
  /// index on every host (hosts in the same order everywhere), which requires every host
  /// to have local->size() ranks. Selects the reduce-scatter / rail all-reduce / all-gather
  /// form; leaders and localRoot are then ignored.
  Links* rail = nullptr;
};

/// Hierarchical all-reduce. With groups.rail: ring reduce-scatter over the local group
/// (local rank i ends owning block (i + 1) mod L of L even blocks), all-reduce of that
/// block along the rail, ring all-gather over the local group. Without: binomial reduce
/// to the local root, all-reduce of the partial results among leaders, then broadcast
/// from the local root (binomial or chain by size). Avg divides once, by worldSize. In
/// place when sendbuf == recvbuf. Throws InvalidArgument when the groups are inconsistent
/// (no local group, a leader without leaders Links, a bad localRoot).
void hierarchicalAllreduce(const HierarchicalGroups& groups, const void* sendbuf, void* recvbuf, size_t count,
                           DType dtype, ReduceOp op, const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
