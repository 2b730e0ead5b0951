// Hierarchical all-reduce for groups spread over several hosts: reduce inside each host
// (cheap shared memory), all-reduce among one leader per host (the only inter-host
// traffic: one vector per host instead of one per rank), broadcast inside each host.
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
  /// Algorithm among leaders: Auto, Ring, HalvingDoubling, Tree or ReduceBroadcast.
  Algorithm leaderAlgorithm = Algorithm::Auto;
};

/// Hierarchical all-reduce: binomial reduce to the local root, all-reduce of the partial
/// results among leaders, then broadcast from the local root (binomial or chain by size).
/// In place when sendbuf == recvbuf. Throws InvalidArgument when the groups are
/// inconsistent (no local group, a leader without leaders Links, a bad localRoot).
void hierarchicalAllreduce(const HierarchicalGroups& groups, const void* sendbuf, void* recvbuf, size_t count,
                           DType dtype, ReduceOp op, const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
