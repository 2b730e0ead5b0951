// Direct (one message per pair) collective algorithms over Links: every rank talks to
// every other rank at most once per collective. They are latency-optimal for small
// messages and few ranks, serve the collectives that have no pipelined algorithm, and
// reduce in rank order so every rank gets bit-identical results.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/links.h"
#include "kolo/comm/communicator.h"

namespace kolo::comm::native {

/// Every rank sends its vector to every other and reduces all n in rank order.
void directAllreduce(detail::Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                     ReduceOp op);
/// Every rank sends its vector to root, which reduces in rank order.
void directReduce(detail::Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                  int root);
/// Root sends bytes to every rank.
void directBroadcast(detail::Links& links, void* buf, size_t bytes, int root);
/// Rank r's blockBytes[r] bytes from sendbuf land at their offset of every recvbuf.
void directAllgatherv(detail::Links& links, const void* sendbuf, void* recvbuf, const std::vector<size_t>& blockBytes);
/// sendbuf holds size() blocks of recvcount elements; rank r gets block r reduced.
void directReduceScatter(detail::Links& links, const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype,
                         ReduceOp op);
void directGather(detail::Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root);
void directScatter(detail::Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root);
void directAlltoall(detail::Links& links, const void* sendbuf, void* recvbuf, size_t bytes);
/// Dissemination barrier: ceil(log2 n) rounds of empty messages.
void disseminationBarrier(detail::Links& links);

}  // namespace kolo::comm::native
