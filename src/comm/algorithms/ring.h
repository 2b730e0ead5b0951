// Ring algorithms: all-reduce as reduce-scatter followed by all-gather around the ring,
// plus the stand-alone ring reduce-scatter (uneven blocks) and all-gather(v). Each step's
// block travels in pipeline chunks: a chunk is reduced and forwarded to the right
// neighbour while the next chunk is still arriving from the left.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// Ring all-reduce of count elements: 2(n-1) steps, each rank sends and receives
/// 2(n-1)/n of the vector. In place when sendbuf == recvbuf. Scratch: opts.window chunks.
/// Avg divides each block once, by links.size(), before the all-gather. Every rank ends
/// with bit-identical results (each block is reduced by one rank only).
void ringAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                   const AlgorithmOptions& opts = {});

/// Ring reduce-scatter: sendbuf holds sum(recvCounts) elements laid out block after block;
/// rank r receives the reduction of block r (recvCounts[r] elements, may be 0 or differ
/// between ranks) in recvbuf. In place when recvbuf == sendbuf: the result is then left at
/// the start of the buffer. Otherwise recvbuf must not overlap sendbuf. Scratch: a few
/// chunks (more only while a transport holds sends unreceived).
void ringReduceScatter(Links& links, const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvCounts,
                       DType dtype, ReduceOp op, const AlgorithmOptions& opts = {});

/// Ring all-gather of variable-size blocks (bytes): rank r contributes blockBytes[r] bytes
/// from sendbuf; recvbuf receives every block back to back in rank order. sendbuf may be
/// anywhere, including inside recvbuf (e.g. already at rank r's block: in place).
void ringAllgatherv(Links& links, const void* sendbuf, void* recvbuf, const std::vector<size_t>& blockBytes,
                    const AlgorithmOptions& opts = {});

/// Ring all-gather with equal blocks of `bytes` bytes (rank r's block at r * bytes).
void ringAllgather(Links& links, const void* sendbuf, void* recvbuf, size_t bytes,
                   const AlgorithmOptions& opts = {});

namespace ring {

/// Reduce-scatter core over the ring with element blocks `blocks`. At step s rank r sends
/// block (r + shift - s) and receives block (r + shift - s - 1); it ends owning block
/// (r + shift + 1) mod n, whose result (finished for Avg, divided by n) goes to ownDst.
/// Intermediate partial sums are written to stash (full-vector layout) when given, else
/// kept in scratch slots until forwarded.
void reduceScatter(Links& links, const char* src, char* stash, char* ownDst, const Blocks& blocks, int shift,
                   DType dtype, ReduceOp op, const AlgorithmOptions& opts);

/// All-gather core over byte blocks in buf: rank r starts owning block (r + shift) mod n;
/// at step s it sends block (r + shift - s) and receives block (r + shift - s - 1).
void allgather(Links& links, char* buf, const Blocks& byteBlocks, int shift, const AlgorithmOptions& opts);

}  // namespace ring
}  // namespace kolo::comm::detail
