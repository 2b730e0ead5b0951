// Tree algorithms: pipelined reduction up and broadcast down a tree of ranks (binomial,
// chain or flat), and the collectives built from them: reduce, broadcast, tree all-reduce.
// Data moves in chunks, so a parent combines chunk k while its children send chunk k + 1.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

/// One rank's place in a tree: its parent (-1 at the root) and children (group ranks).
struct TreeShape {
  int parent = -1;
  std::vector<int> children;
};

/// Binomial tree rooted at root: depth ceil(log2 n). Children in order of increasing
/// subtree size, or decreasing when largestFirst (broadcast: start the deepest branch first).
TreeShape binomialTree(int rank, int size, int root, bool largestFirst = false);
/// Chain root -> root+1 -> ... (mod size): every link carries the data once.
TreeShape chainTree(int rank, int size, int root);
/// Star: root is the parent of every other rank.
TreeShape flatTree(int rank, int size, int root);

namespace tree {

/// Reduces count elements up the tree. src: this rank's contribution. acc: where this rank
/// combines its subtree (required at the root, which receives the result, finished for Avg
/// by dividing by finishN; elsewhere null means bounded scratch slots). acc may equal src.
void reduce(Links& links, const TreeShape& shape, const char* src, char* acc, size_t count, DType dtype,
            ReduceOp op, int finishN, const AlgorithmOptions& opts);

/// Broadcasts bytes down the tree from its root into buf on every rank.
void broadcast(Links& links, const TreeShape& shape, char* buf, size_t bytes, const AlgorithmOptions& opts);

}  // namespace tree

/// Binomial-tree reduce to root: recvbuf (significant at root only; in place when equal to
/// sendbuf) receives the reduction, divided by size() for Avg. Non-roots use a few chunks
/// of scratch, not the message size.
void treeReduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
                const AlgorithmOptions& opts = {});

/// Binomial-tree broadcast of bytes from root (chunk-pipelined).
void treeBroadcast(Links& links, void* buf, size_t bytes, int root, const AlgorithmOptions& opts = {});

/// Pipelined chain broadcast: for large messages, time ~ (size - 2 + chunks) chunk transfers.
void chainBroadcast(Links& links, void* buf, size_t bytes, int root, const AlgorithmOptions& opts = {});

/// Broadcast choosing binomial tree below opts.chainBroadcastBytes and chain at or above
/// (when more than two ranks).
void broadcast(Links& links, void* buf, size_t bytes, int root, const AlgorithmOptions& opts = {});

/// Tree all-reduce: binomial reduce to rank 0, then binomial broadcast from it. Latency
/// 2 ceil(log2 n) steps; every link above the leaves carries the vector twice.
void treeAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                   const AlgorithmOptions& opts = {});

}  // namespace kolo::comm::detail
