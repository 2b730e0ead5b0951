// Hierarchical all-reduce: local reduce-scatter, rail all-reduce, local all-gather; or
// local tree reduce, leaders' all-reduce, local broadcast.
#include "comm/algorithms/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reduce_kernels.h"
#include "comm/algorithms/tree.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

/// Two hosts: the vector goes through in segments. Segment k's block (each local rank's
/// share) crosses to the other host as one message each way while this host reduces
/// segment k + 1 and gathers segment k - 1, so the link between hosts stays busy and the
/// work inside the host hides behind it. Both hosts reduce the exchanged block in rail
/// order, so results are bit-identical.
void pipelinedTwoHostAllreduce(const HierarchicalGroups& groups, const char* src, char* dst, size_t count,
                               DType dtype, ReduceOp op, const AlgorithmOptions& opts) {
  Links& local = *groups.local;
  Links& rail = *groups.rail;
  const int localSize = local.size();
  const size_t esize = dtypeSize(dtype);
  const ReduceOp partialOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const size_t segCount = std::max<size_t>(1, opts.railSegmentBytes / esize);
  const size_t segments = chunkCount(count, segCount);
  const int owner = mod(local.rank() + 1, localSize);
  const int partner = 1 - rail.rank();
  const bool mineFirst = rail.rank() == 0;
  std::vector<char> incoming;

  struct Segment {
    size_t off = 0;  // elements
    Blocks blocks;
    char* own = nullptr;
    size_t ownCount = 0;
  };
  auto segment = [&](size_t k) {
    Segment s;
    s.off = k * segCount;
    s.blocks = evenBlocks(std::min(segCount, count - s.off), localSize);
    s.own = dst + (s.off + s.blocks.offset[owner]) * esize;
    s.ownCount = s.blocks.length[owner];
    return s;
  };
  auto reduceScatter = [&](const Segment& s) {
    if (localSize > 1) {
      ring::reduceScatter(local, src + s.off * esize, dst + s.off * esize, s.own, s.blocks, 0, dtype, partialOp,
                          opts);
    } else if (src != dst) {
      std::memcpy(s.own, src + s.off * esize, s.ownCount * esize);
    }
  };
  auto allgather = [&](const Segment& s) {
    if (localSize > 1) ring::allgather(local, dst + s.off * esize, scaleBlocks(s.blocks, esize), 1, opts);
  };

  std::unique_ptr<Work> sent, received;
  Segment previous;
  for (size_t k = 0; k <= segments; ++k) {
    Segment current;
    if (k < segments) {
      current = segment(k);
      reduceScatter(current);
    }
    if (k > 0 && previous.ownCount > 0) {
      received->wait();
      sent->wait();  // the block is overwritten with the sum below
      if (mineFirst) {
        reduceTo(previous.own, previous.own, incoming.data(), previous.ownCount, dtype, partialOp);
      } else {
        reduceTo(previous.own, incoming.data(), previous.own, previous.ownCount, dtype, partialOp);
      }
      finishReduction(previous.own, previous.ownCount, dtype, op, groups.worldSize);
    }
    if (k < segments && current.ownCount > 0) {
      incoming.resize(current.ownCount * esize);
      received = rail.irecv(partner, incoming.data(), current.ownCount * esize);
      sent = rail.isend(partner, current.own, current.ownCount * esize);
    }
    if (k > 0) allgather(previous);
    previous = current;
  }
}

void railAllreduce(const HierarchicalGroups& groups, const char* src, char* dst, size_t count, DType dtype,
                   ReduceOp op, const AlgorithmOptions& opts) {
  if (groups.rail->size() == 2 && count * dtypeSize(dtype) > opts.railSegmentBytes)
    return pipelinedTwoHostAllreduce(groups, src, dst, count, dtype, op, opts);
  Links& local = *groups.local;
  Links& rail = *groups.rail;
  const int localSize = local.size();
  const size_t esize = dtypeSize(dtype);
  const ReduceOp partialOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const Blocks blocks = evenBlocks(count, localSize);
  // Local rank i owns block (i + 1) mod L after the reduce-scatter, as in the ring
  // all-reduce, so the all-gather below starts from it; rail members share i, so they
  // hold the same block.
  const int owner = mod(local.rank() + 1, localSize);
  char* own = dst + blocks.offset[owner] * esize;
  if (localSize > 1) {
    ring::reduceScatter(local, src, dst, own, blocks, 0, dtype, partialOp, opts);
  } else if (src != dst) {
    std::memcpy(dst, src, count * esize);
  }
  const size_t ownCount = blocks.length[owner];
  if (ownCount > 0) {
    Algorithm algo = groups.leaderAlgorithm;
    if (algo == Algorithm::Auto) algo = chooseAllreduceAlgorithm(ownCount * esize, rail.size(), rail.size());
    allreduce(rail, own, own, ownCount, dtype, partialOp, algo, opts);
    finishReduction(own, ownCount, dtype, op, groups.worldSize);
  }
  if (localSize > 1) ring::allgather(local, dst, scaleBlocks(blocks, esize), 1, opts);
}

}  // namespace

void hierarchicalAllreduce(const HierarchicalGroups& groups, const void* sendbuf, void* recvbuf, size_t count,
                           DType dtype, ReduceOp op, const AlgorithmOptions& opts) {
  KOLO_CHECK(groups.local != nullptr, "hierarchical all-reduce needs the local group");
  Links& local = *groups.local;
  const int localSize = local.size();
  KOLO_CHECK(groups.localRoot >= 0 && groups.localRoot < localSize, "hierarchical all-reduce: local root ",
             groups.localRoot, " outside local group of ", localSize);
  KOLO_CHECK_GE(groups.worldSize, localSize, "hierarchical all-reduce: world size below the local group size");
  KOLO_CHECK(groups.leaderAlgorithm != Algorithm::Hierarchical, "hierarchical all-reduce cannot nest itself");
  if (groups.rail != nullptr) {
    if (count == 0) return;
    return railAllreduce(groups, static_cast<const char*>(sendbuf), static_cast<char*>(recvbuf), count, dtype, op,
                         opts);
  }
  const bool leader = local.rank() == groups.localRoot;
  KOLO_CHECK(leader == (groups.leaders != nullptr), "hierarchical all-reduce: local rank ", local.rank(),
             (leader ? " is the leader but has no leaders group" : " is not the leader but has a leaders group"));
  if (count == 0) return;

  // Partial results are sums; the average divides once, by the whole group's size.
  const ReduceOp partialOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  char* dst = static_cast<char*>(recvbuf);
  tree::reduce(local, binomialTree(local.rank(), localSize, groups.localRoot), static_cast<const char*>(sendbuf),
               dst, count, dtype, partialOp, localSize, opts);
  if (leader) {
    Links& leaders = *groups.leaders;
    Algorithm algo = groups.leaderAlgorithm;
    if (algo == Algorithm::Auto) algo = chooseAllreduceAlgorithm(count * dtypeSize(dtype), leaders.size(), leaders.size());
    allreduce(leaders, dst, dst, count, dtype, partialOp, algo, opts);
    finishReduction(dst, count, dtype, op, groups.worldSize);
  }
  broadcast(local, dst, count * dtypeSize(dtype), groups.localRoot, opts);
}

}  // namespace kolo::comm::detail
