// The data-parallel gradient Reducer, as PyTorch DDP's: gradients are packed into buckets
// (reverse parameter order) whose all-reduce starts from the gradient-ready hooks while
// backward still runs; finalize() waits, averages and writes the result back to .grad(),
// and broadcasts the model's buffers from the root rank (DDP's broadcast_buffers).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/parallel/comm_hook.h"
#include "kolo/optim.h"
#include "kolo/tensor.h"

namespace kolo::parallel {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Clock = std::chrono::steady_clock;

/// Options of a Reducer.
struct ReducerOptions {
  /// Capacity of every bucket but the first (bytes of gradient); DDP's default is 25 MB.
  size_t bucketCapBytes = size_t{25} << 20;
  /// Capacity of the first bucket (the last parameters, whose gradients are ready first).
  size_t firstBucketCapBytes = size_t{1} << 20;
  /// A small model, whose gradients fill at most `minBuckets` first buckets, is split into
  /// about `minBuckets` buckets of equal bytes (none under 16 KiB) instead of one, so that its
  /// all-reduces overlap backward as a large model's do (a 208 KB model: four of 52 KB, not
  /// one of 1 MiB). 1: the caps alone decide.
  int minBuckets = 4;
  /// Broadcast the parameters (and buffers) from `rootRank` when the reducer is built.
  bool broadcastParameters = true;
  /// Broadcast the buffers (running statistics) from `rootRank` at every synchronised step,
  /// so that every rank's next forward sees root's (DDP's broadcast_buffers, default on).
  bool broadcastBuffers = true;
  int rootRank = 0;
  /// Algorithm (and deadline) of every bucket all-reduce.
  comm::CollectiveOptions collective;
  /// Start each bucket's all-reduce from the hooks, during backward (true), or all of them
  /// in finalize() (false: for hosts with no spare core, where communication progress
  /// would slow backward down more than it hides).
  bool overlap = true;
  /// Sharded optimizer update (ZeRO stage 1) for step(): when every rank is on one host
  /// and the communicator gives a SharedWindow, the buckets live in it; each rank averages
  /// its own contiguous share of the gradients straight from the other ranks' buckets,
  /// updates that share of the weights, and copies the other shares from the ranks that
  /// updated them. Same weights as finalize() + optimizer.step(), for less memory traffic
  /// and a fraction of the update per rank. Elsewhere step() falls back to the all-reduce.
  bool shardOptimizer = false;
};

/// Timestamps of one synchronised step, for showing overlap of communication and backward.
struct StepTimeline {
  Clock::time_point backwardStart;              // prepareForBackward()
  Clock::time_point lastHook;                   // the last gradient-ready hook of the pass
  Clock::time_point finalizeStart;              // finalize() entered
  Clock::time_point finalizeEnd;                // finalize() returned
  std::vector<Clock::time_point> bucketStart;   // iallreduce started, per bucket
  std::vector<Clock::time_point> bucketFinish;  // its wait() returned, per bucket
};

/// Reduces the gradients of one model replica across the ranks of a communicator.
///
/// Protocol per step: (optionally prepareForBackward()), loss.backward(), finalize(). Each
/// parameter's gradient-ready hook copies its gradient into its bucket's flat buffer; when
/// every gradient of a bucket is in, and every earlier bucket has been started, the
/// bucket's iallreduce starts (buckets start in the same order on every rank). finalize()
/// starts whatever is left, waits for every bucket, divides by the number of ranks that
/// took part (see join()) in place, and makes each parameter's .grad() a view of its bucket
/// slot (DDP's gradient_as_bucket_view): from then on autograd accumulates straight into
/// the buckets and the hooks copy nothing. The buckets own that storage; zeroGrad() keeps it.
///
/// The last bucket carries three extra elements: whether the rank is active (not joined),
/// how many parameters got no gradient on it, and its loss, so that every rank learns the
/// divisor, whether any rank lacks a gradient (all ranks then throw instead of hanging), and
/// the global mean loss, without another collective.
///
/// Buffers (nn::Module::namedBuffers(): running statistics, counters) are not reduced: with
/// options.broadcastBuffers, every synchronised step ends (after the gradients are in) with
/// a broadcast of root's buffers, one message per dtype, so the next forward starts from
/// root's on every rank, as DDP's broadcast at the start of forward. While ranks have joined
/// (uneven inputs) the buffers are left alone; join() ends with every rank taking them from
/// the rank it takes the parameters from.
///
/// With a communication hook (registerCommHook, kolo/parallel/comm_hook.h) each bucket's
/// gradients go through the hook instead of the plain all-reduce; the last bucket's three
/// extra elements then travel in a small all-reduce of their own, started right after the
/// hook's collectives for that bucket.
///
/// Not copyable. Hooks are removed by the destructor. The parameters must all be of one
/// floating dtype (f32 or f64) and outlive the reducer, as must the buffers (any dtype,
/// contiguous).
class Reducer {
 public:
  /// Builds the buckets (collective when options.broadcastParameters: every rank must call).
  Reducer(NamedTensors parameters, std::shared_ptr<comm::Communicator> comm,
          ReducerOptions options = {}, NamedTensors buffers = {});
  /// Reduces model.namedParameters() and broadcasts model.namedBuffers(), as DDP(model).
  Reducer(const nn::Module& model, std::shared_ptr<comm::Communicator> comm,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Marks the start of a backward pass (timestamp, resets per-step state). Optional:
  /// the first hook of a pass does the same if this was not called.
  void prepareForBackward();
  /// Records this rank's loss of the step; finalize() then makes globalLoss() available.
  void setLocalLoss(double loss) { localLoss_ = loss; }
  /// Waits for every bucket and leaves the averaged gradients in .grad(). Throws
  /// kolo::Error naming the parameters that got no gradient in this pass (on every rank, if
  /// any rank lacks one), and rethrows communication errors (Timeout, IoError, Mismatch).
  /// Inside a noSync scope, does nothing.
  void finalize();
  /// finalize() then optimizer.step(), or, when the update is sharded (sharded()), the
  /// sharded update: the weights end up as finalize() + optimizer.step() would leave them
  /// on every rank. After a sharded step each rank's .grad() holds its own local gradient
  /// (the average is never written out), and its optimizer state is current in the rank's
  /// share only: consolidateOptimizerState() makes the state whole. The optimizer
  /// must hold (some of) this reducer's parameters. Inside a noSync scope, does nothing.
  /// Collective; throws as finalize() does.
  void step(optim::Optimizer& optimizer);
  /// Whether step() shards the optimizer update (shardOptimizer and a shared window).
  bool sharded() const { return window_ != nullptr; }
  /// Collective: after sharded steps, gives every rank the whole optimizer state (each
  /// element from the rank that owns it), e.g. before it is saved. No-op when not sharded.
  void consolidateOptimizerState(optim::Optimizer& optimizer);
  /// The mean of setLocalLoss() over the active ranks of the last finalize().
  double globalLoss() const { return globalLoss_; }
  /// The number of ranks that contributed gradients at the last finalize().
  int activeRanks() const { return activeRanks_; }

  /// RAII scope in which backward passes only accumulate gradients locally (no
  /// communication); the first synchronised pass after it reduces the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& reducer);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  /// Opens a noSync scope (see NoSyncGuard).
  [[nodiscard]] NoSyncGuard noSync() { return NoSyncGuard(*this); }

  /// Uneven inputs: a rank that has run out of data calls join() instead of further steps.
  /// It shadows every step of the ranks still training with an all-reduce of zeros
  /// (counting as inactive, so their divisor is the number of active ranks) and returns
  /// when every rank has joined; then every rank takes the parameters of the rank that
  /// trained the most steps (optimizer state is not synchronised). Returns the number of
  /// steps shadowed. Collective: the ranks still training call finalize() per step.
  /// Not available with a sharded update (InvalidArgument).
  int64_t join();

  /// Routes every bucket through `hook` from the next pass on (nullptr: back to the plain
  /// all-reduce). Every rank must register the same kind of hook before the same pass.
  /// Throws InvalidArgument with a sharded update (sharded()) or during a pass.
  void registerCommHook(std::shared_ptr<CommHook> hook);
  CommHook* commHook() const { return hook_.get(); }
  /// Bytes this rank has handed to gradient collectives (payload, see
  /// CommHook::bytesSent): the buckets, their extra elements, and what a hook sent.
  uint64_t bytesSent() const { return bytesSent_ + (hook_ ? hook_->bytesSent() : 0); }

  /// Number of buckets and, per bucket, the parameter indices it holds (in hook order).
  size_t bucketCount() const { return buckets_.size(); }
  std::vector<size_t> bucketParameters(size_t bucket) const { return buckets_.at(bucket).params; }
  size_t bucketBytes(size_t bucket) const;
  /// Timestamps of the last synchronised step.
  const StepTimeline& timeline() const { return timeline_; }
  comm::Communicator& communicator() { return *comm_; }
  const NamedTensors& parameters() const { return params_; }
  const NamedTensors& buffers() const { return buffers_; }

 private:
  struct Bucket {
    std::vector<size_t> params;        // indices into params_
    std::vector<size_t> offsets;       // element offset of each in the flat buffer
    size_t numel = 0;                  // gradient elements (without the extra slots)
    Tensor flat;                       // numel (+ extra slots for the last bucket)
    size_t pending = 0;                // gradients still missing this pass
    std::unique_ptr<comm::Work> work;  // in flight
    bool started = false;
  };

  // Extra elements at the end of the last bucket: [active, missing gradients, loss].
  static constexpr size_t kExtraSlots = 3;

  void onGradReady(size_t param);
  void beginPass();
  void startReadyBuckets();
  void startBucket(size_t b);
  // Hands bucket b to hook_ (and, for the last bucket, all-reduces the extras).
  void startHook(size_t b);
  void writeExtras(double active, double missing, double loss);
  void broadcastFromRoot();
  // Root's buffers to every rank: one broadcast per dtype of a flat copy.
  void broadcastBuffers(int root);
  std::string unreadyNames() const;
  void syncFinalParameters();
  // Makes each .grad() a view of its bucket slot (DDP's gradient_as_bucket_view), so the
  // next backward accumulates straight into the bucket.
  void viewGradsInBuckets();
  // Sharded update (reducer_sharded.cc).
  void setUpWindow();
  void shardedStep(optim::Optimizer& optimizer);
  // Elements [begin, end) of parameter k that rank r owns (begin == end: none).
  std::pair<int64_t, int64_t> ownedPart(size_t k, int r) const;
  // Element offset of parameter k's slot in the window layout.
  size_t layoutOffset(size_t k) const;
  // For each parameter the optimizer holds, its index in params_ (InvalidArgument if absent).
  std::vector<size_t> indicesOf(const optim::Optimizer& optimizer) const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::shared_ptr<comm::Communicator> comm_;
  ReducerOptions options_;
  DType dtype_ = DType::F32;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucketOf_;  // parameter -> bucket
  std::vector<size_t> slotOf_;    // parameter -> position in its bucket
  std::vector<bool> ready_;       // parameter got its gradient this pass
  std::vector<int> hookIds_;
  size_t nextToStart_ = 0;
  bool inPass_ = false;
  bool sync_ = true;
  bool joined_ = false;
  double localLoss_ = 0.0;
  double globalLoss_ = 0.0;
  int activeRanks_ = 0;
  int64_t syncedSteps_ = 0;
  StepTimeline timeline_;
  std::shared_ptr<CommHook> hook_;
  std::unique_ptr<comm::Work> extrasWork_;  // the last bucket's extras, with a hook
  uint64_t bytesSent_ = 0;                  // without the hook's own count
  std::mutex mutex_;  // hooks may fire on an autograd worker thread
  // Sharded update: the window holds, per rank, every bucket (gradients, from gradBase_)
  // and then the same layout again for the weights a rank publishes (from weightBase_).
  std::shared_ptr<comm::SharedWindow> window_;
  std::vector<size_t> bucketStart_;  // element offset of each bucket in the layout
  size_t layoutElements_ = 0;        // elements of the layout, extras and padding included
  std::vector<size_t> shardStart_;   // rank r owns layout elements [shardStart_[r], [r+1])
  std::vector<bool> inWindow_;       // parameter k's storage is its slot of the weight half
  std::vector<float> shardMean_;     // the mean of this rank's share (more than two ranks)
};

}  // namespace kolo::parallel
