// The automatic all-reduce choice and the dispatch from Algorithm to implementation.
#include "comm/algorithms/algorithms.h"

#include "kolo/error.h"

namespace kolo::comm::detail {

Algorithm chooseAllreduceAlgorithm(size_t bytes, int worldSize, int hosts) {
  if (worldSize <= 1) return Algorithm::Ring;
  if (hosts > 1 && worldSize > hosts) return Algorithm::Hierarchical;
  if (bytes <= kLatencyBytes || worldSize == 2) return Algorithm::HalvingDoubling;
  return Algorithm::Ring;
}

void allreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
               Algorithm algorithm, const AlgorithmOptions& opts, const HierarchicalGroups* groups) {
  if (algorithm == Algorithm::Auto) algorithm = chooseAllreduceAlgorithm(count * dtypeSize(dtype), links.size(), 1);
  switch (algorithm) {
    case Algorithm::Ring: return ringAllreduce(links, sendbuf, recvbuf, count, dtype, op, opts);
    case Algorithm::HalvingDoubling: return halvingDoublingAllreduce(links, sendbuf, recvbuf, count, dtype, op, opts);
    case Algorithm::Tree: return treeAllreduce(links, sendbuf, recvbuf, count, dtype, op, opts);
    case Algorithm::ReduceBroadcast: return reduceBroadcastAllreduce(links, sendbuf, recvbuf, count, dtype, op, opts);
    case Algorithm::Hierarchical:
      KOLO_CHECK(groups != nullptr, "hierarchical all-reduce needs the local and leaders groups");
      return hierarchicalAllreduce(*groups, sendbuf, recvbuf, count, dtype, op, opts);
    case Algorithm::Auto: break;
  }
  KOLO_THROW(InvalidArgument, "all-reduce: unknown algorithm code ", static_cast<int>(algorithm));
}

void reduceScatter(Links& links, const void* sendbuf, void* recvbuf, size_t recvCount, DType dtype, ReduceOp op,
                   const AlgorithmOptions& opts) {
  ringReduceScatter(links, sendbuf, recvbuf, std::vector<size_t>(links.size(), recvCount), dtype, op, opts);
}

}  // namespace kolo::comm::detail
