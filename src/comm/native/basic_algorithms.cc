// Direct all-reduce and all-gather: one message per pair of ranks, reductions in rank order.
#include "comm/native/basic_algorithms.h"

#include <cstring>
#include <memory>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

using WorkList = std::vector<std::unique_ptr<Work>>;

void waitAll(WorkList& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

char* at(void* p, size_t off) { return static_cast<char*>(p) + off; }

}  // namespace

void directAllreduce(detail::Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                     ReduceOp op) {
  const int n = links.size();
  const int me = links.rank();
  const size_t bytes = count * dtypeSize(dtype);
  // Every contribution, own included, in a scratch block by rank: the send of our own
  // vector may still read sendbuf (== recvbuf in place) while we reduce.
  std::unique_ptr<char[]> all(new char[bytes * static_cast<size_t>(n)]);
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.irecv(p, all.get() + bytes * p, bytes));
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.isend(p, sendbuf, bytes));
  std::memcpy(all.get() + bytes * me, sendbuf, bytes);
  waitAll(works);
  if (n == 1) {
    std::memcpy(recvbuf, all.get(), bytes);
  } else {
    detail::reduceTo(recvbuf, all.get(), all.get() + bytes, count, dtype, op);
    for (int p = 2; p < n; ++p) detail::reduceInto(recvbuf, all.get() + bytes * p, count, dtype, op);
  }
  detail::finishReduction(recvbuf, count, dtype, op, n);
}

void directAllgatherv(detail::Links& links, const void* sendbuf, void* recvbuf,
                      const std::vector<size_t>& blockBytes) {
  const int n = links.size();
  const int me = links.rank();
  std::vector<size_t> offset(static_cast<size_t>(n) + 1, 0);
  for (int p = 0; p < n; ++p) offset[p + 1] = offset[p] + blockBytes[p];
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.irecv(p, at(recvbuf, offset[p]), blockBytes[p]));
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.isend(p, sendbuf, blockBytes[me]));
  waitAll(works);  // sendbuf may lie inside recvbuf: copy only once every send is done
  if (at(recvbuf, offset[me]) != sendbuf) std::memmove(at(recvbuf, offset[me]), sendbuf, blockBytes[me]);
}

}  // namespace kolo::comm::native
