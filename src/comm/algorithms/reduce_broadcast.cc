// Flat reduce-to-one + broadcast all-reduce over the star-shaped tree.
#include "comm/algorithms/reduce_broadcast.h"

#include "comm/algorithms/tree.h"

namespace kolo::comm::detail {

void reduceBroadcastAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                              ReduceOp op, const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  if (count == 0) return;
  char* dst = static_cast<char*>(recvbuf);
  const TreeShape star = flatTree(r, n, 0);
  tree::reduce(links, star, static_cast<const char*>(sendbuf), r == 0 ? dst : nullptr, count, dtype, op, n, opts);
  if (n > 1) tree::broadcast(links, star, dst, count * dtypeSize(dtype), opts);
}

}  // namespace kolo::comm::detail
