// Tree shapes and the chunk-pipelined tree reduce and broadcast, plus the reduce,
// broadcast and all-reduce entry points built on them.
#include "comm/algorithms/tree.h"

#include <algorithm>
#include <cstring>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

TreeShape binomialTree(int rank, int size, int root, bool largestFirst) {
  TreeShape shape;
  const int vr = mod(rank - root, size);
  auto real = [&](int v) { return mod(v + root, size); };
  if (vr != 0) shape.parent = real(vr & (vr - 1));  // clear the lowest set bit
  // Children differ from vr in one bit below its lowest set bit.
  for (int mask = 1; mask < size && (vr & mask) == 0; mask <<= 1)
    if (vr + mask < size) shape.children.push_back(real(vr + mask));
  if (largestFirst) std::reverse(shape.children.begin(), shape.children.end());
  return shape;
}

TreeShape chainTree(int rank, int size, int root) {
  TreeShape shape;
  const int vr = mod(rank - root, size);
  if (vr > 0) shape.parent = mod(rank - 1, size);
  if (vr + 1 < size) shape.children.push_back(mod(rank + 1, size));
  return shape;
}

TreeShape flatTree(int rank, int size, int root) {
  TreeShape shape;
  if (rank != root) {
    shape.parent = root;
    return shape;
  }
  for (int v = 1; v < size; ++v) shape.children.push_back(mod(root + v, size));
  return shape;
}

namespace tree {

void reduce(Links& links, const TreeShape& shape, const char* src, char* acc, size_t count, DType dtype,
            ReduceOp op, int finishN, const AlgorithmOptions& opts) {
  const bool isRoot = shape.parent < 0;
  KOLO_CHECK(!isRoot || acc != nullptr, "tree reduce: the root needs a result buffer");
  const size_t esize = dtypeSize(dtype);
  const size_t chunkLen = chunkElements(opts, esize);
  const size_t chunks = chunkCount(count, chunkLen);
  const size_t window = static_cast<size_t>(std::max(opts.window, 1));
  const size_t nc = shape.children.size();

  SlotPool pool(chunkLen * esize);
  SendQueue sends(links, &pool);
  // posted[j]: receives from child j, oldest first, each with its scratch slot.
  std::vector<std::deque<std::pair<std::unique_ptr<Work>, char*>>> posted(nc);
  size_t nextPost = 0;
  for (size_t c = 0; c < chunks; ++c) {
    // Keep `window` chunks in flight from every child.
    for (; nextPost < chunks && nextPost < c + window; ++nextPost) {
      if (sends.pending() > 0) sends.prune();
      const size_t len = std::min(chunkLen, count - nextPost * chunkLen);
      for (size_t j = 0; j < nc; ++j) {
        char* slot = pool.acquire();
        posted[j].emplace_back(links.irecv(shape.children[j], slot, len * esize), slot);
      }
    }
    const size_t off = c * chunkLen;
    const size_t len = std::min(chunkLen, count - off);
    const char* mine = src + off * esize;
    const char* data = mine;
    char* outSlot = nullptr;
    if (nc > 0) {
      char* out = acc != nullptr ? acc + off * esize : (outSlot = pool.acquire());
      for (size_t j = 0; j < nc; ++j) {
        posted[j].front().first->wait();
        char* slot = posted[j].front().second;
        posted[j].pop_front();
        if (j == 0) {
          reduceTo(out, mine, slot, len, dtype, op);
        } else {
          reduceInto(out, slot, len, dtype, op);
        }
        pool.release(slot);
      }
      data = out;
    }
    if (isRoot) {
      char* out = acc + off * esize;
      if (data != out) std::memcpy(out, data, len * esize);
      finishReduction(out, len, dtype, op, finishN);
    } else {
      sends.post(shape.parent, data, len * esize, outSlot);
    }
  }
  sends.waitAll();
}

void broadcast(Links& links, const TreeShape& shape, char* buf, size_t bytes, const AlgorithmOptions& opts) {
  const size_t chunk = std::max<size_t>(1, opts.chunkBytes);
  const size_t chunks = chunkCount(bytes, chunk);
  const size_t window = static_cast<size_t>(std::max(opts.window, 1));
  SendQueue sends(links);
  std::deque<std::unique_ptr<Work>> posted;
  size_t nextPost = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * chunk;
    const size_t len = std::min(chunk, bytes - off);
    if (shape.parent >= 0) {
      for (; nextPost < chunks && nextPost < c + window; ++nextPost) {
        const size_t o = nextPost * chunk;
        posted.push_back(links.irecv(shape.parent, buf + o, std::min(chunk, bytes - o)));
      }
      posted.front()->wait();
      posted.pop_front();
    }
    for (int child : shape.children) sends.post(child, buf + off, len);
  }
  sends.waitAll();
}

}  // namespace tree

void treeReduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
                const AlgorithmOptions& opts) {
  const int n = links.size();
  KOLO_CHECK(root >= 0 && root < n, "reduce root ", root, " outside group of ", n);
  if (count == 0) return;
  const bool isRoot = links.rank() == root;
  tree::reduce(links, binomialTree(links.rank(), n, root), static_cast<const char*>(sendbuf),
               isRoot ? static_cast<char*>(recvbuf) : nullptr, count, dtype, op, n, opts);
}

void treeBroadcast(Links& links, void* buf, size_t bytes, int root, const AlgorithmOptions& opts) {
  const int n = links.size();
  KOLO_CHECK(root >= 0 && root < n, "broadcast root ", root, " outside group of ", n);
  if (bytes == 0 || n == 1) return;
  tree::broadcast(links, binomialTree(links.rank(), n, root, true), static_cast<char*>(buf), bytes, opts);
}

void chainBroadcast(Links& links, void* buf, size_t bytes, int root, const AlgorithmOptions& opts) {
  const int n = links.size();
  KOLO_CHECK(root >= 0 && root < n, "broadcast root ", root, " outside group of ", n);
  if (bytes == 0 || n == 1) return;
  tree::broadcast(links, chainTree(links.rank(), n, root), static_cast<char*>(buf), bytes, opts);
}

void broadcast(Links& links, void* buf, size_t bytes, int root, const AlgorithmOptions& opts) {
  if (links.size() > 2 && bytes >= opts.chainBroadcastBytes) {
    chainBroadcast(links, buf, bytes, root, opts);
  } else {
    treeBroadcast(links, buf, bytes, root, opts);
  }
}

void treeAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                   const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  if (count == 0) return;
  char* dst = static_cast<char*>(recvbuf);
  // Every rank has a full-size result buffer, so subtrees combine in place there.
  tree::reduce(links, binomialTree(r, n, 0), static_cast<const char*>(sendbuf), dst, count, dtype, op, n, opts);
  if (n > 1) tree::broadcast(links, binomialTree(r, n, 0, true), dst, count * dtypeSize(dtype), opts);
}

}  // namespace kolo::comm::detail
