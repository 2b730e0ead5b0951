// Shared building blocks of the collective algorithms: block layouts, chunking, the send
// queue, the scratch slot pool and the chunked receive helpers.
#include "comm/algorithms/pipeline.h"

#include <algorithm>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

Blocks evenBlocks(size_t count, int n) {
  KOLO_CHECK_GE(n, 1, "block split needs at least one rank");
  Blocks b;
  b.offset.resize(n);
  b.length.resize(n);
  const size_t base = count / static_cast<size_t>(n);
  const size_t extra = count % static_cast<size_t>(n);
  size_t off = 0;
  for (int i = 0; i < n; ++i) {
    b.offset[i] = off;
    b.length[i] = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    off += b.length[i];
  }
  b.total = off;
  return b;
}

Blocks blocksFromLengths(const std::vector<size_t>& lengths) {
  Blocks b;
  b.length = lengths;
  b.offset.resize(lengths.size());
  size_t off = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    b.offset[i] = off;
    off += lengths[i];
  }
  b.total = off;
  return b;
}

Blocks scaleBlocks(const Blocks& blocks, size_t scale) {
  Blocks b = blocks;
  for (auto& o : b.offset) o *= scale;
  for (auto& l : b.length) l *= scale;
  b.total *= scale;
  return b;
}

size_t chunkElements(const AlgorithmOptions& opts, size_t elemSize) {
  return std::max<size_t>(1, opts.chunkBytes / elemSize);
}

char* SlotPool::acquire() {
  if (!free_.empty()) {
    char* slot = free_.back();
    free_.pop_back();
    return slot;
  }
  owned_.push_back(std::make_unique<char[]>(slotBytes_));
  return owned_.back().get();
}

void SlotPool::release(char* slot) {
  if (slot != nullptr) free_.push_back(slot);
}

void SendQueue::post(int peer, const void* data, size_t bytes, char* slot) {
  pending_.push_back({links_.isend(peer, data, bytes), slot});
  // Retire finished sends now and then so long pipelines keep few handles alive.
  if (pending_.size() % 16 == 0) prune();
}

void SendQueue::postChunks(int peer, const void* data, size_t bytes, size_t chunkBytes) {
  const char* p = static_cast<const char*>(data);
  for (size_t off = 0; off < bytes; off += chunkBytes) post(peer, p + off, std::min(chunkBytes, bytes - off));
}

void SendQueue::prune() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->work->test()) {
      it->work->wait();  // rethrows the send's error, if any
      if (pool_ != nullptr) pool_->release(it->slot);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void SendQueue::waitAll() {
  while (!pending_.empty()) {
    pending_.front().work->wait();
    if (pool_ != nullptr) pool_->release(pending_.front().slot);
    pending_.pop_front();
  }
}

void recvChunks(Links& links, int peer, void* dst, size_t bytes, size_t chunkBytes, int window) {
  char* p = static_cast<char*>(dst);
  const size_t chunks = chunkCount(bytes, chunkBytes);
  std::deque<std::unique_ptr<Work>> posted;
  size_t next = 0;
  for (size_t c = 0; c < chunks; ++c) {
    while (next < chunks && (posted.size() < static_cast<size_t>(std::max(window, 1)))) {
      const size_t off = next * chunkBytes;
      posted.push_back(links.irecv(peer, p + off, std::min(chunkBytes, bytes - off)));
      ++next;
    }
    posted.front()->wait();
    posted.pop_front();
  }
}

void recvReduceChunks(Links& links, int peer, void* dst, const void* local, size_t count, DType dtype,
                      ReduceOp op, bool incomingFirst, const AlgorithmOptions& opts) {
  const size_t esize = dtypeSize(dtype);
  const size_t chunkLen = chunkElements(opts, esize);
  const size_t chunks = chunkCount(count, chunkLen);
  if (chunks == 0) return;
  const size_t window = std::min<size_t>(std::max(opts.window, 1), chunks);
  SlotPool pool(chunkLen * esize);
  std::deque<std::pair<std::unique_ptr<Work>, char*>> posted;  // destroyed before pool
  char* out = static_cast<char*>(dst);
  const char* mine = static_cast<const char*>(local);
  size_t next = 0;
  for (size_t c = 0; c < chunks; ++c) {
    while (next < chunks && posted.size() < window) {
      char* slot = pool.acquire();
      const size_t len = std::min(chunkLen, count - next * chunkLen);
      posted.emplace_back(links.irecv(peer, slot, len * esize), slot);
      ++next;
    }
    posted.front().first->wait();
    char* slot = posted.front().second;
    const size_t off = c * chunkLen;
    const size_t len = std::min(chunkLen, count - off);
    if (incomingFirst) {
      reduceTo(out + off * esize, slot, mine + off * esize, len, dtype, op);
    } else {
      reduceTo(out + off * esize, mine + off * esize, slot, len, dtype, op);
    }
    posted.pop_front();
    pool.release(slot);
  }
}

}  // namespace kolo::comm::detail
