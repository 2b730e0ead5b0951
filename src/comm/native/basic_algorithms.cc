// Direct collective algorithms: one message per pair of ranks, reductions in rank order.
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

const char* at(const void* p, size_t off) { return static_cast<const char*>(p) + off; }
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

void directReduce(detail::Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                  int root) {
  const int n = links.size();
  const int me = links.rank();
  const size_t bytes = count * dtypeSize(dtype);
  if (me != root) {
    links.send(root, sendbuf, bytes);
    return;
  }
  std::unique_ptr<char[]> all(new char[bytes * static_cast<size_t>(n)]);
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.irecv(p, all.get() + bytes * p, bytes));
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

void directBroadcast(detail::Links& links, void* buf, size_t bytes, int root) {
  const int n = links.size();
  if (links.rank() != root) {
    links.recv(root, buf, bytes);
    return;
  }
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != root) works.push_back(links.isend(p, buf, bytes));
  waitAll(works);
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

void directReduceScatter(detail::Links& links, const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype,
                         ReduceOp op) {
  const int n = links.size();
  const int me = links.rank();
  const size_t bytes = recvcount * dtypeSize(dtype);
  std::unique_ptr<char[]> all(new char[bytes * static_cast<size_t>(n)]);
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.irecv(p, all.get() + bytes * p, bytes));
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.isend(p, at(sendbuf, bytes * p), bytes));
  std::memcpy(all.get() + bytes * me, at(sendbuf, bytes * me), bytes);
  waitAll(works);
  if (n == 1) {
    std::memcpy(recvbuf, all.get(), bytes);
  } else {
    detail::reduceTo(recvbuf, all.get(), all.get() + bytes, recvcount, dtype, op);
    for (int p = 2; p < n; ++p) detail::reduceInto(recvbuf, all.get() + bytes * p, recvcount, dtype, op);
  }
  detail::finishReduction(recvbuf, recvcount, dtype, op, n);
}

void directGather(detail::Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root) {
  const int n = links.size();
  const int me = links.rank();
  if (me != root) {
    links.send(root, sendbuf, bytes);
    return;
  }
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.irecv(p, at(recvbuf, bytes * p), bytes));
  waitAll(works);
  if (at(recvbuf, bytes * me) != sendbuf) std::memmove(at(recvbuf, bytes * me), sendbuf, bytes);
}

void directScatter(detail::Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root) {
  const int n = links.size();
  const int me = links.rank();
  if (me != root) {
    links.recv(root, recvbuf, bytes);
    return;
  }
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.isend(p, at(sendbuf, bytes * p), bytes));
  waitAll(works);
  if (at(sendbuf, bytes * me) != recvbuf) std::memmove(recvbuf, at(sendbuf, bytes * me), bytes);
}

void directAlltoall(detail::Links& links, const void* sendbuf, void* recvbuf, size_t bytes) {
  const int n = links.size();
  const int me = links.rank();
  // In place, the outgoing blocks must be copied before incoming ones overwrite them.
  std::unique_ptr<char[]> copy;
  const void* src = sendbuf;
  if (sendbuf == recvbuf && n > 1) {
    copy.reset(new char[bytes * static_cast<size_t>(n)]);
    std::memcpy(copy.get(), sendbuf, bytes * static_cast<size_t>(n));
    src = copy.get();
  }
  WorkList works;
  for (int p = 0; p < n; ++p)
    if (p != me) works.push_back(links.irecv(p, at(recvbuf, bytes * p), bytes));
  for (int k = 1; k < n; ++k) {  // staggered so not everyone sends to rank 0 first
    const int p = (me + k) % n;
    works.push_back(links.isend(p, at(src, bytes * p), bytes));
  }
  if (src != recvbuf) std::memmove(at(recvbuf, bytes * me), at(src, bytes * me), bytes);
  waitAll(works);
}

void disseminationBarrier(detail::Links& links) {
  const int n = links.size();
  const int me = links.rank();
  for (int dist = 1; dist < n; dist *= 2) {
    auto r = links.irecv((me - dist + n) % n, nullptr, 0);
    auto s = links.isend((me + dist) % n, nullptr, 0);
    r->wait();
    s->wait();
  }
}

}  // namespace kolo::comm::native
