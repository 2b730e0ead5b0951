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
                     ReduceOp op, std::vector<char>& scratch) {
  const int n = links.size();
  const int me = links.rank();
  const size_t bytes = count * dtypeSize(dtype);
  // Incoming vectors by rank; our own is read from sendbuf, except in place on a rank that
  // is not among the first two: there the reduction overwrites it before reading it.
  const bool copyOwn = sendbuf == recvbuf && me >= 2;
  if (scratch.size() < bytes * static_cast<size_t>(n)) scratch.resize(bytes * static_cast<size_t>(n));
  std::vector<const char*> part(static_cast<size_t>(n));
  WorkList works;
  for (int p = 0; p < n; ++p) {
    part[p] = p == me && !copyOwn ? static_cast<const char*>(sendbuf) : scratch.data() + bytes * p;
    if (p != me) works.push_back(links.irecv(p, scratch.data() + bytes * p, bytes));
  }
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.isend(p, sendbuf, bytes));
  if (copyOwn) std::memcpy(scratch.data() + bytes * me, sendbuf, bytes);
  // Every send completes before recvbuf (possibly sendbuf) is written.
  waitAll(works);
  if (n == 1) {
    if (recvbuf != sendbuf) std::memcpy(recvbuf, sendbuf, bytes);
  } else {
    detail::reduceTo(recvbuf, part[0], part[1], count, dtype, op);
    for (int p = 2; p < n; ++p) detail::reduceInto(recvbuf, part[p], count, dtype, op);
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
