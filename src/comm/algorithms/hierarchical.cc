// Hierarchical all-reduce: local tree reduce, leaders' all-reduce, local broadcast.
#include "comm/algorithms/hierarchical.h"

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reduce_kernels.h"
#include "comm/algorithms/tree.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

void hierarchicalAllreduce(const HierarchicalGroups& groups, const void* sendbuf, void* recvbuf, size_t count,
                           DType dtype, ReduceOp op, const AlgorithmOptions& opts) {
  KOLO_CHECK(groups.local != nullptr, "hierarchical all-reduce needs the local group");
  Links& local = *groups.local;
  const int localSize = local.size();
  KOLO_CHECK(groups.localRoot >= 0 && groups.localRoot < localSize, "hierarchical all-reduce: local root ",
             groups.localRoot, " outside local group of ", localSize);
  KOLO_CHECK_GE(groups.worldSize, localSize, "hierarchical all-reduce: world size below the local group size");
  const bool leader = local.rank() == groups.localRoot;
  KOLO_CHECK(leader == (groups.leaders != nullptr), "hierarchical all-reduce: local rank ", local.rank(),
             (leader ? " is the leader but has no leaders group" : " is not the leader but has a leaders group"));
  KOLO_CHECK(groups.leaderAlgorithm != Algorithm::Hierarchical, "hierarchical all-reduce cannot nest itself");
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
