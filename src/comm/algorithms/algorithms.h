// Entry header of kolo's collective algorithms over the Links seam (src/comm/links.h):
// reduction kernels, the all-reduce algorithms (ring, halving-doubling, tree,
// reduce-broadcast, hierarchical), the other collectives, and the automatic choice.
// Every function is collective over the ranks of its Links: all of them call it with the
// same count, dtype, op, root and AlgorithmOptions, and it returns when this rank's part is
// done (its buffers may be reused). Errors come from the Links (Timeout, IoError,
// Mismatch) or are InvalidArgument for inconsistent arguments.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/algorithms/alltoall.h"
#include "comm/algorithms/barrier.h"
#include "comm/algorithms/gather_scatter.h"
#include "comm/algorithms/halving_doubling.h"
#include "comm/algorithms/hierarchical.h"
#include "comm/algorithms/pipeline.h"
#include "comm/algorithms/reduce_broadcast.h"
#include "comm/algorithms/reduce_kernels.h"
#include "comm/algorithms/ring.h"
#include "comm/algorithms/tree.h"

namespace kolo::comm::detail {

/// The automatic all-reduce choice for a message of `bytes` bytes over worldSize ranks on
/// `hosts` hosts (1 when all share one host):
///
/// | condition                                         | algorithm         | why                                    |
/// |---------------------------------------------------|-------------------|----------------------------------------|
/// | worldSize <= 1                                    | Ring              | nothing moves; any is fine             |
/// | hosts > 1 and worldSize > hosts                   | Hierarchical      | one vector per host crosses the network |
/// | bytes <= kLatencyBytes (64 KiB)                   | HalvingDoubling   | log2 p steps (recursive doubling when tiny) |
/// | worldSize == 2                                    | HalvingDoubling   | same traffic as ring, fewer messages   |
/// | otherwise                                         | Ring              | bandwidth-optimal, pipelined chunks    |
///
/// Tree and ReduceBroadcast are never chosen automatically (they move more bytes through
/// the root); they stay selectable for comparison and for groups of two or three.
Algorithm chooseAllreduceAlgorithm(size_t bytes, int worldSize, int hosts);

/// Message size (bytes) at or below which Auto prefers latency over bandwidth.
inline constexpr size_t kLatencyBytes = 64 * 1024;

/// All-reduce over links with the given algorithm (Auto: chooseAllreduceAlgorithm with one
/// host). Hierarchical needs the two-level groups: call hierarchicalAllreduce, or pass them
/// here (groups is ignored by the flat algorithms). In place when sendbuf == recvbuf.
void allreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
               Algorithm algorithm, const AlgorithmOptions& opts = {}, const HierarchicalGroups* groups = nullptr);

/// Reduce to root (binomial tree); recvbuf significant at root only.
inline void reduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
                   const AlgorithmOptions& opts = {}) {
  treeReduce(links, sendbuf, recvbuf, count, dtype, op, root, opts);
}

/// Reduce-scatter with equal blocks: sendbuf holds size() * recvCount elements.
void reduceScatter(Links& links, const void* sendbuf, void* recvbuf, size_t recvCount, DType dtype, ReduceOp op,
                   const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
