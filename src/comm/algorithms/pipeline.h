// Building blocks shared by the collective algorithms: tuning options, the split of a
// vector into per-rank blocks, chunking, a queue of in-flight sends, a pool of bounded
// scratch slots, and chunked send / receive / receive-and-reduce helpers over Links.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "comm/links.h"
#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::detail {

/// Tuning knobs of the algorithms. Every rank of a collective must pass the same values:
/// they decide how messages are cut into chunks, and both ends must cut alike.
struct AlgorithmOptions {
  /// Pipeline unit: large transfers travel as messages of this many bytes (rounded down
  /// to whole elements), so the reduction of one chunk overlaps the transfer of the next.
  /// Scratch memory is a few chunks per peer, never the whole message.
  size_t chunkBytes = 128 * 1024;
  /// Receives posted ahead of the one being consumed (per peer stream).
  int window = 4;
  /// Halving-doubling exchanges whole vectors (recursive doubling: log2 p steps instead of
  /// 2 log2 p) at or below this size, and whenever count < the power-of-two group size.
  size_t recursiveDoublingBytes = 32 * 1024;
  /// broadcast(): binomial tree below this size (latency), pipelined chain at or above
  /// (bandwidth: every link carries the message once).
  size_t chainBroadcastBytes = 1024 * 1024;
  /// Hierarchical all-reduce over two hosts: segment size of its software pipeline (the
  /// exchange between hosts of one segment overlaps the work inside the host on the next).
  size_t railSegmentBytes = 1024 * 1024;
};

/// Offsets and lengths of n consecutive blocks (in elements or bytes, by context).
struct Blocks {
  std::vector<size_t> offset;
  std::vector<size_t> length;
  size_t total = 0;
  int size() const { return static_cast<int>(length.size()); }
};

/// count split into n blocks as evenly as possible, the first count % n one longer.
Blocks evenBlocks(size_t count, int n);
/// Blocks of the given lengths, laid out back to back.
Blocks blocksFromLengths(const std::vector<size_t>& lengths);
/// Every offset and length multiplied by scale (elements -> bytes).
Blocks scaleBlocks(const Blocks& blocks, size_t scale);

/// Elements per pipeline chunk for elements of elemSize bytes (at least 1).
size_t chunkElements(const AlgorithmOptions& opts, size_t elemSize);
/// Number of chunks of chunkLen covering len (0 when len is 0).
inline size_t chunkCount(size_t len, size_t chunkLen) { return (len + chunkLen - 1) / chunkLen; }

inline int mod(int a, int n) { return ((a % n) + n) % n; }

/// Fixed-size scratch buffers handed out and taken back. Grows when every slot is busy
/// (a transport that holds send buffers until the receiver drains them), so algorithms
/// never wait on a send to free memory; with buffered transports it stays at the few
/// slots the receive window needs.
class SlotPool {
 public:
  explicit SlotPool(size_t slotBytes) : slotBytes_(slotBytes == 0 ? 1 : slotBytes) {}
  char* acquire();
  void release(char* slot);
  size_t slotBytes() const { return slotBytes_; }
  size_t allocatedSlots() const { return owned_.size(); }

 private:
  size_t slotBytes_;
  std::vector<std::unique_ptr<char[]>> owned_;
  std::vector<char*> free_;
};

/// In-flight isends, completed in any order; an optional slot goes back to its pool when
/// its send completes. The destructor does not wait: algorithms call waitAll() before
/// returning or before writing into memory that may still be being sent.
class SendQueue {
 public:
  explicit SendQueue(Links& links, SlotPool* pool = nullptr) : links_(links), pool_(pool) {}
  /// Starts an isend of data to peer; `slot` (if not null) is released when it completes.
  void post(int peer, const void* data, size_t bytes, char* slot = nullptr);
  /// Posts data as consecutive messages of at most chunkBytes (none when bytes is 0).
  void postChunks(int peer, const void* data, size_t bytes, size_t chunkBytes);
  /// Retires the sends that have completed, without blocking.
  void prune();
  /// Waits for every pending send (rethrowing transport errors).
  void waitAll();
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    std::unique_ptr<Work> work;
    char* slot;
  };
  Links& links_;
  SlotPool* pool_;
  std::deque<Pending> pending_;
};

/// Receives bytes from peer into dst as messages of at most chunkBytes, keeping up to
/// opts.window receives posted. Blocks until all have arrived.
void recvChunks(Links& links, int peer, void* dst, size_t bytes, size_t chunkBytes, int window);

/// Receives count elements from peer in chunks (chunkElements(opts)) and combines them
/// with `local`: dst = local op incoming, or incoming op local when incomingFirst (ranks
/// that must agree bit for bit put the lower rank's operand first). dst may equal local.
void recvReduceChunks(Links& links, int peer, void* dst, const void* local, size_t count, DType dtype,
                      ReduceOp op, bool incomingFirst, const AlgorithmOptions& opts);

}  // namespace kolo::comm::detail
