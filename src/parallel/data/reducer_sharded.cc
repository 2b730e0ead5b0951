// The Reducer's sharded optimizer update (ZeRO stage 1 over a shared-memory window): every
// rank's buckets live in a window the other ranks on the host map; each rank averages its
// own share of the gradients from all ranks' buckets (two ranks inside the optimizer's
// loop), updates that share of the weights (which live in the window too), and copies the
// other shares. Two barriers per step order the phases.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "kolo/error.h"
#include "kolo/trace.h"
#include "kolo/parallel/reducer.h"

namespace kolo::parallel {
namespace {

// Shard and bucket boundaries fall on cache lines (16 floats) so no two ranks write one.
constexpr size_t kAlignElements = 16;

size_t alignUp(size_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KOLO_SHARD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KOLO_SHARD_CLONES
#endif

// out[i] = (sum over the n sources of source[s][i]) * scale, summed in source order.
KOLO_SHARD_CLONES void averageInto(float* __restrict out, const float* const* sources, int n,
                                   size_t count, float scale) {
  for (size_t i = 0; i < count; ++i) {
    float sum = sources[0][i];
    for (int s = 1; s < n; ++s) sum += sources[s][i];
    out[i] = sum * scale;
  }
}

// Storage over `count` floats of shared memory that `owner` keeps mapped.
std::shared_ptr<Storage> windowStorage(float* data, size_t count,
                                       std::shared_ptr<comm::SharedWindow> owner) {
  auto storage = std::make_shared<Storage>();
  storage->bytes = std::shared_ptr<uint8_t[]>(reinterpret_cast<uint8_t*>(data),
                                              [owner = std::move(owner)](uint8_t*) {});
  storage->nbytes = count * sizeof(float);
  return storage;
}

// A flat f32 tensor over `count` floats of shared memory.
Tensor windowTensor(float* data, size_t count, std::shared_ptr<comm::SharedWindow> owner) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = windowStorage(data, count, std::move(owner));
  impl->shape = {static_cast<int64_t>(count)};
  impl->strides = {1};
  impl->dtype = DType::F32;
  return Tensor(std::move(impl));
}

}  // namespace

void Reducer::setUpWindow() {
  bucketStart_.clear();
  size_t elements = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bucketStart_.push_back(elements);
    const size_t extra = (b + 1 == buckets_.size()) ? kExtraSlots : 0;
    elements = alignUp(elements + buckets_[b].numel + extra);
  }
  layoutElements_ = elements;
  const int n = comm_->size();
  shardStart_.assign(static_cast<size_t>(n) + 1, 0);
  for (int r = 1; r < n; ++r)
    shardStart_[static_cast<size_t>(r)] =
        elements * static_cast<size_t>(r) / static_cast<size_t>(n) / kAlignElements * kAlignElements;
  shardStart_[static_cast<size_t>(n)] = elements;
  // Gradients, then the published weights, in one window.
  window_ = comm_->allocateSharedWindow(2 * elements * sizeof(float));
  if (!window_) return;
  float* base = static_cast<float*>(window_->local());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const size_t extra = (b + 1 == buckets_.size()) ? kExtraSlots : 0;
    buckets_[b].flat = windowTensor(base + bucketStart_[b], buckets_[b].numel + extra, window_);
  }
  // A parameter that owns its whole storage moves into the weight half, so the update
  // writes its share where the other ranks read it; any other keeps its storage and its
  // share is copied there after each update.
  inWindow_.assign(params_.size(), false);
  auto weights = windowStorage(base + elements, elements, window_);
  for (size_t k = 0; k < params_.size(); ++k) {
    TensorImpl* impl = params_[k].second.impl();
    if (impl->offset != 0 || impl->storage->nbytes != params_[k].second.nbytes()) continue;
    const size_t at = layoutOffset(k);
    std::memcpy(base + elements + at, impl->storage->bytes.get(), impl->storage->nbytes);
    impl->storage = weights;
    impl->offset = static_cast<int64_t>(at);
    inWindow_[k] = true;
  }
}

size_t Reducer::layoutOffset(size_t k) const {
  return bucketStart_[bucketOf_[k]] + buckets_[bucketOf_[k]].offsets[slotOf_[k]];
}

std::vector<size_t> Reducer::indicesOf(const optim::Optimizer& optimizer) const {
  std::unordered_map<const TensorImpl*, size_t> indexOf;
  for (size_t k = 0; k < params_.size(); ++k) indexOf[params_[k].second.impl()] = k;
  std::vector<size_t> index;
  for (const auto& [name, parameter] : optimizer.parameters()) {
    auto found = indexOf.find(parameter.impl());
    KOLO_CHECK(found != indexOf.end(), "Reducer: optimizer parameter '", name,
               "' is not one of this reducer's parameters");
    index.push_back(found->second);
  }
  return index;
}

std::pair<int64_t, int64_t> Reducer::ownedPart(size_t k, int r) const {
  const size_t start = layoutOffset(k);
  const size_t end = start + static_cast<size_t>(params_[k].second.numel());
  const size_t lo = std::max(start, shardStart_[static_cast<size_t>(r)]);
  const size_t hi = std::min(end, shardStart_[static_cast<size_t>(r) + 1]);
  if (lo >= hi) return {0, 0};
  return {static_cast<int64_t>(lo - start), static_cast<int64_t>(hi - start)};
}

void Reducer::shardedStep(optim::Optimizer& optimizer) {
  trace::Scope span("sharded update", "comm");
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;
  timeline_.finalizeStart = Clock::now();
  if (!inPass_) beginPass();
  const int n = comm_->size();
  const int me = comm_->rank();
  size_t missing = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (ready_[k]) continue;
    ++missing;
    Bucket& b = buckets_[bucketOf_[k]];
    std::memset(b.flat.data<float>() + b.offsets[slotOf_[k]], 0, params_[k].second.nbytes());
  }
  writeExtras(1.0, static_cast<double>(missing), localLoss_);
  inPass_ = false;

  // Phase 1: every rank's gradients are in its part of the window.
  comm_->barrier(options_.collective);
  std::vector<const float*> grads(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) grads[static_cast<size_t>(r)] = static_cast<const float*>(window_->part(r));
  const size_t extras = bucketStart_.back() + buckets_.back().numel;
  // What this rank handed over: its whole gradient and the extra slots (the window's padding
  // between shards carries nothing).
  size_t handed = kExtraSlots;
  for (const auto& param : params_) handed += static_cast<size_t>(param.second.numel());
  bytesSent_ += handed * sizeof(float);
  double missingTotal = 0.0;
  double lossTotal = 0.0;
  for (int r = 0; r < n; ++r) {
    missingTotal += grads[static_cast<size_t>(r)][extras + 1];
    lossTotal += grads[static_cast<size_t>(r)][extras + 2];
  }
  if (missingTotal > 0.5) {
    if (missing > 0)
      KOLO_THROW(Error, "Reducer (rank ", me, "): parameter(s) ", unreadyNames(),
                 " got no gradient in this backward pass; every parameter must take part in the "
                 "loss on every rank");
    KOLO_THROW(Error, "Reducer (rank ", me, "): ", std::lround(missingTotal),
               " parameter gradient(s) were missing on other rank(s) in this backward pass (see "
               "their errors)");
  }
  activeRanks_ = n;
  globalLoss_ = lossTotal / n;

  // Phase 2: update this rank's share of the weights with the mean of every rank's share of
  // the gradients, and publish it in the weight half of the window. Two ranks' gradients
  // are averaged inside the update loop; more are averaged into a buffer first. Either way
  // each rank's buckets, and so its .grad(), keep its own gradient.
  float* own = static_cast<float*>(window_->local());
  const size_t lo = shardStart_[static_cast<size_t>(me)];
  const size_t hi = shardStart_[static_cast<size_t>(me) + 1];
  const float scale = 1.0f / static_cast<float>(n);  // n >= 2: one rank has no window
  if (n > 2) {
    std::vector<const float*> sources(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) sources[static_cast<size_t>(r)] = grads[static_cast<size_t>(r)] + lo;
    shardMean_.resize(hi - lo);
    averageInto(shardMean_.data(), sources.data(), n, hi - lo, scale);
  }

  const std::vector<size_t> index = indicesOf(optimizer);
  std::vector<optim::ParameterPart> parts(index.size());
  for (size_t i = 0; i < index.size(); ++i) {
    const size_t k = index[i];
    const auto [begin, end] = ownedPart(k, me);
    const size_t at = layoutOffset(k) + static_cast<size_t>(begin);
    if (begin == end) {
      parts[i] = {begin, end, {}};
    } else if (n > 2) {
      parts[i] = {begin, end, {.data = shardMean_.data() + (at - lo)}};
    } else {
      parts[i] = {begin, end, {.data = grads[0] + at, .other = grads[1] + at, .scale = scale}};
    }
  }
  optimizer.stepParts(parts);
  float* published = own + layoutElements_;
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto [begin, end] = ownedPart(k, me);
    if (begin == end || inWindow_[k]) continue;
    std::memcpy(published + layoutOffset(k) + begin, params_[k].second.data<float>() + begin,
                static_cast<size_t>(end - begin) * sizeof(float));
  }

  // Phase 3: every share is published; take the others' from their ranks.
  comm_->barrier(options_.collective);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const float* theirs = grads[static_cast<size_t>(r)] + layoutElements_;
    for (size_t k = 0; k < params_.size(); ++k) {
      const auto [begin, end] = ownedPart(k, r);
      if (begin == end) continue;
      std::memcpy(params_[k].second.data<float>() + begin, theirs + layoutOffset(k) + begin,
                  static_cast<size_t>(end - begin) * sizeof(float));
    }
  }
  ++syncedSteps_;
  viewGradsInBuckets();
  if (options_.broadcastBuffers) broadcastBuffers(options_.rootRank);
  timeline_.finalizeEnd = Clock::now();
}

void Reducer::consolidateOptimizerState(optim::Optimizer& optimizer) {
  if (!window_) return;
  const std::vector<size_t> index = indicesOf(optimizer);
  optim::StateDict state = optimizer.stateDict();
  const int me = comm_->rank();
  for (size_t i = 0; i < index.size(); ++i) {
    const auto& [name, parameter] = optimizer.parameters()[i];
    auto slots = state.perParameter.find(name);
    if (slots == state.perParameter.end()) continue;
    const auto [begin, end] = ownedPart(index[i], me);
    // Every element is current on exactly one rank: zero the rest and sum.
    for (auto& [slot, tensor] : slots->second) {
      if (tensor.numel() != parameter.numel() || tensor.dtype() != DType::F32) continue;
      Tensor flat = tensor.reshape({tensor.numel()});
      float* data = flat.data<float>();
      std::fill(data, data + begin, 0.0f);
      std::fill(data + end, data + flat.numel(), 0.0f);
      comm_->allreduce(data, data, static_cast<size_t>(flat.numel()), DType::F32,
                       comm::ReduceOp::Sum, options_.collective);
      tensor = flat.view(parameter.shape());  // loadStateDict() wants the parameter's shape
    }
  }
  optimizer.loadStateDict(state);
}

}  // namespace kolo::parallel
