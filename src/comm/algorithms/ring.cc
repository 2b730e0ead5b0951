// Ring reduce-scatter, all-gather and all-reduce with chunk pipelining. Messages on each
// ring edge are a fixed sequence (step by step, chunk by chunk) that both neighbours
// derive from the same block layout, so no headers or lengths need to be exchanged.
#include "comm/algorithms/ring.h"

#include <algorithm>
#include <cstring>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace ring {
namespace {

// One chunk expected from the left neighbour: at `step`, elements/bytes [off, off + len).
struct Piece {
  int step;
  size_t off;
  size_t len;
};

std::vector<Piece> incomingPieces(const Blocks& blocks, int rank, int shift, size_t chunkLen) {
  const int n = blocks.size();
  std::vector<Piece> pieces;
  for (int s = 0; s + 1 < n; ++s) {
    const int b = mod(rank + shift - s - 1, n);
    for (size_t o = 0; o < blocks.length[b]; o += chunkLen)
      pieces.push_back({s, blocks.offset[b] + o, std::min(chunkLen, blocks.length[b] - o)});
  }
  return pieces;
}

}  // namespace

void reduceScatter(Links& links, const char* src, char* stash, char* ownDst, const Blocks& blocks, int shift,
                   DType dtype, ReduceOp op, const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const size_t esize = dtypeSize(dtype);
  const size_t chunkLen = chunkElements(opts, esize);
  const int owner = mod(r + shift + 1, n);
  const size_t window = static_cast<size_t>(std::max(opts.window, 1));

  SlotPool pool(chunkLen * esize);
  SendQueue sends(links, &pool);
  // Step 0 forwards this rank's own contribution straight from the source buffer.
  const int first = mod(r + shift, n);
  for (size_t o = 0; o < blocks.length[first]; o += chunkLen) {
    const size_t len = std::min(chunkLen, blocks.length[first] - o);
    sends.post(right, src + (blocks.offset[first] + o) * esize, len * esize);
  }

  const std::vector<Piece> pieces = incomingPieces(blocks, r, shift, chunkLen);
  std::deque<std::pair<std::unique_ptr<Work>, char*>> posted;
  size_t next = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    while (next < pieces.size() && posted.size() < window) {
      if (sends.pending() > 0) sends.prune();  // hand finished send slots back first
      char* slot = pool.acquire();
      posted.emplace_back(links.irecv(left, slot, pieces[next].len * esize), slot);
      ++next;
    }
    posted.front().first->wait();
    char* slot = posted.front().second;
    posted.pop_front();
    const Piece& p = pieces[i];
    const char* mine = src + p.off * esize;
    if (p.step == n - 2) {
      // Last step: this chunk of the owned block is complete.
      char* out = ownDst + (p.off - blocks.offset[owner]) * esize;
      reduceTo(out, mine, slot, p.len, dtype, op);
      finishReduction(out, p.len, dtype, op, n);
      pool.release(slot);
    } else if (stash != nullptr) {
      char* out = stash + p.off * esize;
      reduceTo(out, mine, slot, p.len, dtype, op);
      pool.release(slot);
      sends.post(right, out, p.len * esize);
    } else {
      // The slot itself carries the partial result on; it returns to the pool when sent.
      reduceInto(slot, mine, p.len, dtype, op);
      sends.post(right, slot, p.len * esize, slot);
    }
  }
  sends.waitAll();
}

void allgather(Links& links, char* buf, const Blocks& byteBlocks, int shift, const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const size_t chunk = std::max<size_t>(1, opts.chunkBytes);
  const size_t window = static_cast<size_t>(std::max(opts.window, 1));

  SendQueue sends(links);
  const int first = mod(r + shift, n);
  sends.postChunks(right, buf + byteBlocks.offset[first], byteBlocks.length[first], chunk);

  // Chunks land directly in place and are forwarded from there (except at the last step).
  const std::vector<Piece> pieces = incomingPieces(byteBlocks, r, shift, chunk);
  std::deque<std::unique_ptr<Work>> posted;
  size_t next = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    while (next < pieces.size() && posted.size() < window) {
      posted.push_back(links.irecv(left, buf + pieces[next].off, pieces[next].len));
      ++next;
    }
    posted.front()->wait();
    posted.pop_front();
    if (pieces[i].step < n - 2) sends.post(right, buf + pieces[i].off, pieces[i].len);
  }
  sends.waitAll();
}

}  // namespace ring

void ringAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                   const AlgorithmOptions& opts) {
  const int n = links.size();
  const size_t esize = dtypeSize(dtype);
  const char* src = static_cast<const char*>(sendbuf);
  char* dst = static_cast<char*>(recvbuf);
  if (count == 0) return;
  if (n == 1) {
    if (src != dst) std::memcpy(dst, src, count * esize);
    return;
  }
  const Blocks blocks = evenBlocks(count, n);
  const int owner = mod(links.rank() + 1, n);
  ring::reduceScatter(links, src, dst, dst + blocks.offset[owner] * esize, blocks, 0, dtype, op, opts);
  ring::allgather(links, dst, scaleBlocks(blocks, esize), 1, opts);
}

void ringReduceScatter(Links& links, const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvCounts,
                       DType dtype, ReduceOp op, const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  KOLO_CHECK_EQ(recvCounts.size(), static_cast<size_t>(n), "reduce-scatter needs one count per rank");
  const size_t esize = dtypeSize(dtype);
  const Blocks blocks = blocksFromLengths(recvCounts);
  const char* src = static_cast<const char*>(sendbuf);
  char* dst = static_cast<char*>(recvbuf);
  const bool inPlace = src == dst;
  if (n == 1) {
    if (!inPlace && blocks.total > 0) std::memmove(dst, src, blocks.total * esize);
    return;
  }
  if (blocks.total == 0) return;
  // In place, the owned block is finished where it lies, then moved to the front.
  char* ownDst = inPlace ? dst + blocks.offset[r] * esize : dst;
  ring::reduceScatter(links, src, nullptr, ownDst, blocks, -1, dtype, op, opts);
  if (inPlace && blocks.offset[r] != 0 && blocks.length[r] > 0)
    std::memmove(dst, ownDst, blocks.length[r] * esize);
}

void ringAllgatherv(Links& links, const void* sendbuf, void* recvbuf, const std::vector<size_t>& blockBytes,
                    const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  KOLO_CHECK_EQ(blockBytes.size(), static_cast<size_t>(n), "all-gather needs one block size per rank");
  const Blocks blocks = blocksFromLengths(blockBytes);
  char* dst = static_cast<char*>(recvbuf);
  char* own = dst + blocks.offset[r];
  if (static_cast<const void*>(own) != sendbuf && blocks.length[r] > 0) std::memmove(own, sendbuf, blocks.length[r]);
  if (n == 1 || blocks.total == 0) return;
  ring::allgather(links, dst, blocks, 0, opts);
}

void ringAllgather(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, const AlgorithmOptions& opts) {
  ringAllgatherv(links, sendbuf, recvbuf, std::vector<size_t>(links.size(), bytes), opts);
}

}  // namespace kolo::comm::detail
