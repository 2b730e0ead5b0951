// Communication hooks of the Reducer, as PyTorch DDP's register_comm_hook: a hook is
// handed each gradient bucket when it is ready and decides how it crosses the wire (plain
// all-reduce, a cast to 16 bits, a low-rank or sparse approximation). Built-in hooks are in
// kolo/parallel/compression.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/tensor.h"

namespace kolo::parallel {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// One gradient bucket as a hook sees it. `buffer` is a 1-D view of the bucket's flat
/// gradients (the parameters' gradients back to back at `offsets`, in the reducer's dtype,
/// f32 or f64); the hook reduces it in place.
struct GradBucket {
  size_t index = 0;  // 0 is the first bucket started (it holds the last parameters)
  size_t count = 0;  // buckets of the reducer
  Tensor buffer;
  std::vector<std::string> names;  // parameter names, in the order of `offsets`
  std::vector<Shape> shapes;       // their shapes
  std::vector<size_t> offsets;     // element offset of each in `buffer`
  comm::Communicator* comm = nullptr;
  comm::CollectiveOptions collective;
  /// True for the last bucket of a pass: stateful hooks count their steps on it.
  bool isLast() const { return index + 1 == count; }
};

/// A communication hook. Contract: run() is called once per bucket and synchronised pass,
/// on every rank, in the same bucket order; it may start collectives on bucket.comm (and
/// may block on them: the communicator runs them in the order they were started), and
/// returns a Work whose wait() leaves in bucket.buffer the SUM over the ranks of what the
/// hook transmits in place of their gradients (the exact sum for a lossless hook). The
/// reducer then divides by the number of active ranks, as without a hook. wait() is called
/// once, in bucket order, from Reducer::finalize(); it may start further collectives. A hook
/// serves one reducer; its state (residuals, step counts) is per rank.
class CommHook {
 public:
  virtual ~CommHook() = default;
  /// Short name ("allreduce", "fp16", "powersgd:4", ...).
  virtual std::string name() const = 0;
  /// Starts reducing `bucket` (see the class comment). Throws InvalidArgument for a bucket
  /// it cannot handle (a dtype it does not support).
  virtual std::unique_ptr<comm::Work> run(const GradBucket& bucket) = 0;
  /// The hook's state as named tensors (saved in checkpoints); empty when stateless.
  virtual NamedTensors stateDict() const { return {}; }
  /// Restores stateDict(); throws InvalidArgument naming an entry that does not fit.
  virtual void loadStateDict(const NamedTensors& state) { (void)state; }
  /// Bytes this rank has handed to collectives through the hook (payload: element count
  /// times element size of each collective's contribution, not the algorithm's traffic).
  uint64_t bytesSent() const { return bytesSent_.load(std::memory_order_relaxed); }

 protected:
  void countBytes(uint64_t bytes) { bytesSent_.fetch_add(bytes, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> bytesSent_{0};
};

/// A Work that is already complete (for hooks that finish inside run()).
std::unique_ptr<comm::Work> completedWork();
/// A Work whose wait() waits for `first` (if any) and then runs `then` once.
std::unique_ptr<comm::Work> thenWork(std::unique_ptr<comm::Work> first, std::function<void()> then);

}  // namespace kolo::parallel
