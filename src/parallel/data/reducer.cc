// Reducer: DDP-style gradient buckets whose all-reduce starts from the gradient-ready
// hooks, the buffer broadcast, the join protocol for uneven inputs, and the
// missing-gradient check.
#include "kolo/parallel/reducer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kolo/error.h"
#include "kolo/trace.h"

namespace kolo::parallel {
namespace {

template <class T>
void scaleInPlace(T* data, size_t n, T scale) {
  for (size_t i = 0; i < n; ++i) data[i] *= scale;
}

}  // namespace

Reducer::Reducer(const nn::Module& model, std::shared_ptr<comm::Communicator> comm,
                 ReducerOptions options)
    : Reducer(model.namedParameters(), std::move(comm), options, model.namedBuffers()) {}

Reducer::Reducer(NamedTensors parameters, std::shared_ptr<comm::Communicator> comm,
                 ReducerOptions options, NamedTensors buffers)
    : params_(std::move(parameters)),
      buffers_(std::move(buffers)),
      comm_(std::move(comm)),
      options_(options) {
  KOLO_REQUIRE(comm_ != nullptr, "Reducer needs a communicator");
  KOLO_REQUIRE(!params_.empty(), "Reducer needs at least one parameter");
  KOLO_REQUIRE(options_.bucketCapBytes > 0, "Reducer: bucketCapBytes must be positive");
  KOLO_REQUIRE(options_.firstBucketCapBytes > 0, "Reducer: firstBucketCapBytes must be positive");
  KOLO_REQUIRE(options_.minBuckets >= 1, "ReducerOptions::minBuckets must be at least 1, got ",
               options_.minBuckets);
  dtype_ = params_.front().second.dtype();
  KOLO_CHECK(dtype_ == DType::F32 || dtype_ == DType::F64, "Reducer: parameter '",
             params_.front().first, "' has dtype ", dtypeName(dtype_),
             "; only f32 and f64 are reduced");
  for (const auto& [name, p] : params_) {
    KOLO_CHECK(p.defined(), "Reducer: parameter '", name, "' is undefined");
    KOLO_CHECK(p.dtype() == dtype_, "Reducer: parameter '", name, "' has dtype ",
               dtypeName(p.dtype()), " but '", params_.front().first, "' has ", dtypeName(dtype_),
               "; one dtype per reducer");
    KOLO_CHECK(p.isContiguous(), "Reducer: parameter '", name, "' is not contiguous");
  }
  for (const auto& [name, b] : buffers_)
    KOLO_CHECK(b.defined() && b.isContiguous(), "Reducer: buffer '", name,
               "' is undefined or not contiguous");

  // Buckets in reverse parameter order: the gradients of the last layers are ready first.
  const size_t elemBytes = dtypeSize(dtype_);
  // A small model gets minBuckets buckets rather than one that only starts once backward is
  // over; a bucket under 16 KiB costs more in latency than its overlap saves.
  size_t modelBytes = 0;
  for (const auto& [name, p] : params_) modelBytes += static_cast<size_t>(p.numel()) * elemBytes;
  const auto wanted = static_cast<size_t>(options_.minBuckets);
  if (wanted > 1 && modelBytes <= wanted * options_.firstBucketCapBytes) {
    const size_t share = std::max<size_t>(size_t{16} << 10, (modelBytes + wanted - 1) / wanted);
    options_.firstBucketCapBytes = std::min(options_.firstBucketCapBytes, share);
    options_.bucketCapBytes = std::min(options_.bucketCapBytes, share);
  }
  bucketOf_.assign(params_.size(), 0);
  slotOf_.assign(params_.size(), 0);
  Bucket current;
  auto close = [&] {
    if (!current.params.empty()) buckets_.push_back(std::move(current));
    current = Bucket();
  };
  for (size_t k = params_.size(); k-- > 0;) {
    const size_t bytes = static_cast<size_t>(params_[k].second.numel()) * elemBytes;
    const size_t cap = buckets_.empty() ? options_.firstBucketCapBytes : options_.bucketCapBytes;
    if (!current.params.empty() && (current.numel * elemBytes + bytes) > cap) close();
    bucketOf_[k] = buckets_.size();
    slotOf_[k] = current.params.size();
    current.params.push_back(k);
    current.offsets.push_back(current.numel);
    current.numel += static_cast<size_t>(params_[k].second.numel());
  }
  close();
  if (options_.shardOptimizer && comm_->size() > 1 && dtype_ == DType::F32) setUpWindow();
  if (window_) {
    options_.overlap = false;  // step() reads the buckets in place: nothing to start early
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const size_t extra = (b + 1 == buckets_.size()) ? kExtraSlots : 0;
      buckets_[b].flat = Tensor::zeros({static_cast<int64_t>(buckets_[b].numel + extra)}, dtype_);
    }
  }
  ready_.assign(params_.size(), false);
  timeline_.bucketStart.resize(buckets_.size());
  timeline_.bucketFinish.resize(buckets_.size());

  if (options_.broadcastParameters && comm_->size() > 1) {
    broadcastFromRoot();
    broadcastBuffers(options_.rootRank);
  }

  for (size_t k = 0; k < params_.size(); ++k) {
    hookIds_.push_back(params_[k].second.addGradReadyHook([this, k](Tensor&) { onGradReady(k); }));
  }
}

Reducer::~Reducer() {
  for (size_t k = 0; k < hookIds_.size(); ++k) params_[k].second.removeGradReadyHook(hookIds_[k]);
  // A bucket still in flight writes into flat buffers we own: let it land (errors ignored,
  // a destructor must not throw).
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  }
  if (extrasWork_) {
    try {
      extrasWork_->wait();
    } catch (...) {
    }
  }
}

size_t Reducer::bucketBytes(size_t bucket) const {
  return buckets_.at(bucket).numel * dtypeSize(dtype_);
}

void Reducer::broadcastFromRoot() {
  // One broadcast per bucket rather than per parameter: fewer, larger messages.
  const size_t elemBytes = dtypeSize(dtype_);
  for (auto& b : buckets_) {
    auto* flat = static_cast<uint8_t*>(b.flat.rawData());
    for (size_t i = 0; i < b.params.size(); ++i) {
      const Tensor& p = params_[b.params[i]].second;
      std::memcpy(flat + b.offsets[i] * elemBytes, p.rawData(), p.nbytes());
    }
    comm_->broadcast(flat, b.numel, dtype_, options_.rootRank, options_.collective);
    for (size_t i = 0; i < b.params.size(); ++i) {
      Tensor& p = params_[b.params[i]].second;
      std::memcpy(p.rawData(), flat + b.offsets[i] * elemBytes, p.nbytes());
    }
  }
}

void Reducer::broadcastBuffers(int root) {
  if (buffers_.empty() || comm_->size() == 1) return;
  // Same dtypes in the same order on every rank (the models are the same), so the
  // broadcasts' signatures agree.
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64,
                      DType::U8}) {
    int64_t numel = 0;
    for (const auto& [name, b] : buffers_)
      if (b.dtype() == dtype) numel += b.numel();
    if (numel == 0) continue;
    Tensor flat = Tensor::empty({numel}, dtype);
    auto* bytes = static_cast<uint8_t*>(flat.rawData());
    size_t at = 0;
    for (const auto& [name, b] : buffers_) {
      if (b.dtype() != dtype) continue;
      std::memcpy(bytes + at, b.rawData(), b.nbytes());
      at += b.nbytes();
    }
    comm_->broadcast(bytes, static_cast<size_t>(numel), dtype, root, options_.collective);
    at = 0;
    for (auto& [name, b] : buffers_) {
      if (b.dtype() != dtype) continue;
      std::memcpy(b.rawData(), bytes + at, b.nbytes());
      at += b.nbytes();
    }
  }
}

void Reducer::prepareForBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (sync_) beginPass();
}

void Reducer::beginPass() {
  for (auto& b : buckets_) {
    KOLO_CHECK(
        !b.work,
        "Reducer: a new backward pass began while a bucket all-reduce of the previous one is "
        "still in flight; call finalize() after every synchronised backward");
    b.pending = b.params.size();
    b.started = false;
  }
  std::fill(ready_.begin(), ready_.end(), false);
  nextToStart_ = 0;
  inPass_ = true;
  timeline_.backwardStart = Clock::now();
  timeline_.lastHook = timeline_.backwardStart;
  std::fill(timeline_.bucketStart.begin(), timeline_.bucketStart.end(), Clock::time_point());
  std::fill(timeline_.bucketFinish.begin(), timeline_.bucketFinish.end(), Clock::time_point());
}

void Reducer::onGradReady(size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;  // noSync: gradients just accumulate in .grad()
  if (!inPass_) beginPass();
  const std::string& name = params_[k].first;
  KOLO_CHECK(!ready_[k], "Reducer: parameter '", name,
             "' got a second gradient in one synchronised pass; call "
             "finalize() after each backward, or use noSync() to accumulate");
  Bucket& b = buckets_[bucketOf_[k]];
  KOLO_CHECK(!b.started, "Reducer: parameter '", name,
             "' became ready after its bucket was started");
  Tensor grad = params_[k].second.grad();
  KOLO_CHECK(grad.defined(), "Reducer: gradient-ready hook of '", name,
             "' fired without a gradient");
  KOLO_CHECK_EQ(grad.numel(), params_[k].second.numel(), "Reducer: gradient size of '", name, "'");
  const size_t elemBytes = dtypeSize(dtype_);
  uint8_t* slot = static_cast<uint8_t*>(b.flat.rawData()) + b.offsets[slotOf_[k]] * elemBytes;
  // After the first step .grad() is a view of its bucket slot (DDP's
  // gradient_as_bucket_view): autograd accumulated straight into the bucket, nothing to copy.
  if (!(grad.dtype() == dtype_ && grad.isContiguous() && grad.rawData() == slot)) {
    Tensor src = grad.dtype() == dtype_ ? grad.contiguous() : grad.to(dtype_).contiguous();
    std::memcpy(slot, src.rawData(), src.nbytes());
  }
  ready_[k] = true;
  timeline_.lastHook = Clock::now();
  if (--b.pending == 0 && options_.overlap) startReadyBuckets();
}

void Reducer::startReadyBuckets() {
  // Start strictly in bucket order so that every rank issues the same sequence. A start
  // from the hooks means nothing is missing, so the last bucket's extras are known now;
  // finalize() and join() fill them themselves before forcing the remaining starts.
  while (nextToStart_ < buckets_.size() && buckets_[nextToStart_].pending == 0) {
    if (nextToStart_ + 1 == buckets_.size()) writeExtras(1.0, 0.0, localLoss_);
    startBucket(nextToStart_++);
  }
}

void Reducer::writeExtras(double active, double missing, double loss) {
  Bucket& b = buckets_.back();
  const double values[kExtraSlots] = {active, missing, loss};
  for (size_t i = 0; i < kExtraSlots; ++i) {
    if (dtype_ == DType::F32)
      b.flat.data<float>()[b.numel + i] = static_cast<float>(values[i]);
    else
      b.flat.data<double>()[b.numel + i] = values[i];
  }
}

void Reducer::startBucket(size_t index) {
  Bucket& b = buckets_[index];
  const size_t count = b.numel + (index + 1 == buckets_.size() ? kExtraSlots : 0);
  timeline_.bucketStart[index] = Clock::now();
  b.started = true;
  trace::instant("bucket ready", "comm", static_cast<int64_t>(index), static_cast<int64_t>(count * dtypeSize(dtype_)));
  if (hook_) {
    startHook(index);
    return;
  }
  if (comm_->size() == 1) return;  // the sum over one rank is the bucket itself
  bytesSent_ += count * dtypeSize(dtype_);
  b.work = comm_->iallreduce(b.flat.rawData(), b.flat.rawData(), count, dtype_, comm::ReduceOp::Sum,
                             options_.collective);
}

void Reducer::startHook(size_t index) {
  // The hook runs on one rank too: a lossy hook changes the math the same way at every
  // world size, and its state (residuals) evolves the same.
  Bucket& b = buckets_[index];
  GradBucket bucket;
  bucket.index = index;
  bucket.count = buckets_.size();
  bucket.buffer = static_cast<int64_t>(b.numel) == b.flat.numel()
                      ? b.flat
                      : b.flat.slice(0, 0, static_cast<int64_t>(b.numel));
  for (size_t i = 0; i < b.params.size(); ++i) {
    bucket.names.push_back(params_[b.params[i]].first);
    bucket.shapes.push_back(params_[b.params[i]].second.shape());
  }
  bucket.offsets = b.offsets;
  bucket.comm = comm_.get();
  bucket.collective = options_.collective;
  b.work = hook_->run(bucket);
  KOLO_CHECK(b.work != nullptr, "Reducer: communication hook '", hook_->name(),
             "' returned no Work for bucket ", index);
  if (index + 1 == buckets_.size() && comm_->size() > 1) {
    void* extras = static_cast<uint8_t*>(b.flat.rawData()) + b.numel * dtypeSize(dtype_);
    bytesSent_ += kExtraSlots * dtypeSize(dtype_);
    extrasWork_ = comm_->iallreduce(extras, extras, kExtraSlots, dtype_, comm::ReduceOp::Sum,
                                    options_.collective);
  }
}

void Reducer::registerCommHook(std::shared_ptr<CommHook> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  KOLO_CHECK(!window_, "Reducer::registerCommHook: not available with a sharded optimizer "
                       "update (ReducerOptions::shardOptimizer)");
  KOLO_CHECK(!inPass_, "Reducer::registerCommHook: called during a backward pass; register "
                       "the hook before the first backward or after finalize()");
  hook_ = std::move(hook);
}

std::string Reducer::unreadyNames() const {
  std::ostringstream out;
  size_t shown = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (ready_[k]) continue;
    if (shown++) out << ", ";
    out << "'" << params_[k].first << "'";
  }
  return out.str();
}

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;
  timeline_.finalizeStart = Clock::now();
  if (!inPass_) beginPass();  // no hook fired: every parameter is missing

  const size_t elemBytes = dtypeSize(dtype_);
  size_t missing = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (ready_[k]) continue;
    ++missing;
    Bucket& b = buckets_[bucketOf_[k]];
    std::memset(static_cast<uint8_t*>(b.flat.rawData()) + b.offsets[slotOf_[k]] * elemBytes, 0,
                params_[k].second.nbytes());
  }
  Bucket& last = buckets_.back();
  if (!last.started)
    writeExtras(joined_ ? 0.0 : 1.0, static_cast<double>(missing), joined_ ? 0.0 : localLoss_);
  // Ranks must agree on the bucket sequence even when gradients are missing, so start
  // every remaining bucket (with zeros) and report the problem after the exchange.
  for (; nextToStart_ < buckets_.size(); ++nextToStart_) {
    buckets_[nextToStart_].pending = 0;
    startBucket(nextToStart_);
  }
  std::exception_ptr failure;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    try {
      if (buckets_[i].work) buckets_[i].work->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    buckets_[i].work.reset();
    timeline_.bucketFinish[i] = Clock::now();
  }
  if (extrasWork_) {
    try {
      extrasWork_->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    extrasWork_.reset();
  }
  inPass_ = false;
  if (failure) std::rethrow_exception(failure);

  auto extra = [&](size_t i) {
    return dtype_ == DType::F32 ? static_cast<double>(last.flat.data<float>()[last.numel + i])
                                : last.flat.data<double>()[last.numel + i];
  };
  activeRanks_ = static_cast<int>(std::lround(extra(0)));
  const long missingTotal = std::lround(extra(1));
  globalLoss_ = activeRanks_ > 0 ? extra(2) / activeRanks_ : 0.0;
  if (missingTotal > 0) {
    if (missing > 0)
      KOLO_THROW(Error, "Reducer (rank ", comm_->rank(), "): parameter(s) ", unreadyNames(),
                 " got no gradient in this backward pass; every parameter must take part in the "
                 "loss on every rank");
    KOLO_THROW(Error, "Reducer (rank ", comm_->rank(), "): ", missingTotal,
               " parameter gradient(s) were missing on other rank(s) in this backward pass (see "
               "their errors)");
  }
  if (activeRanks_ == 0 || joined_) {
    timeline_.finalizeEnd = Clock::now();
    return;  // a joined rank keeps its weights until join() syncs them at the end
  }
  ++syncedSteps_;

  // Average over the ranks that contributed, in place in the buckets (the average over
  // one rank is its own gradient).
  for (auto& b : buckets_) {
    if (activeRanks_ > 1 && dtype_ == DType::F32)
      scaleInPlace(b.flat.data<float>(), b.numel, 1.0f / static_cast<float>(activeRanks_));
    else if (activeRanks_ > 1)
      scaleInPlace(b.flat.data<double>(), b.numel, 1.0 / activeRanks_);
  }
  viewGradsInBuckets();
  // Only when every rank trained this step: a joined rank's buffers are stale, and join()
  // hands out the final ones.
  if (options_.broadcastBuffers && activeRanks_ == comm_->size()) broadcastBuffers(options_.rootRank);
  timeline_.finalizeEnd = Clock::now();
}

void Reducer::viewGradsInBuckets() {
  for (auto& b : buckets_) {
    for (size_t i = 0; i < b.params.size(); ++i) {
      Tensor& p = params_[b.params[i]].second;
      const int64_t off = static_cast<int64_t>(b.offsets[i]);
      const uint8_t* slot =
          static_cast<const uint8_t*>(b.flat.rawData()) + b.offsets[i] * dtypeSize(dtype_);
      Tensor grad = p.grad();
      if (grad.defined() && grad.rawData() == slot && grad.isContiguous()) continue;
      p.setGrad(b.flat.slice(0, off, off + p.numel()).view(p.shape()));
    }
  }
}

void Reducer::step(optim::Optimizer& optimizer) {
  if (window_) {
    shardedStep(optimizer);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!sync_) return;
  }
  {
    trace::Scope span("gradient sync", "comm");
    finalize();
  }
  trace::Scope span("optimizer", "compute");
  optimizer.step();
}

Reducer::NoSyncGuard::NoSyncGuard(Reducer& reducer) : reducer_(reducer) {
  std::lock_guard<std::mutex> lock(reducer_.mutex_);
  previous_ = reducer_.sync_;
  reducer_.sync_ = false;
}

Reducer::NoSyncGuard::~NoSyncGuard() {
  std::lock_guard<std::mutex> lock(reducer_.mutex_);
  reducer_.sync_ = previous_;
}

int64_t Reducer::join() {
  KOLO_CHECK(sync_, "Reducer::join() inside a noSync scope");
  KOLO_CHECK(!window_, "Reducer::join() is not available with a sharded optimizer update "
                       "(ReducerOptions::shardOptimizer)");
  int64_t shadowed = 0;
  joined_ = true;
  try {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        beginPass();
        for (auto& b : buckets_) b.flat.fill(0.0);
        std::fill(ready_.begin(), ready_.end(), true);  // zeros stand for every gradient
      }
      finalize();
      if (activeRanks_ == 0) break;
      ++shadowed;
    }
  } catch (...) {
    joined_ = false;
    throw;
  }
  joined_ = false;
  syncFinalParameters();
  return shadowed;
}

void Reducer::syncFinalParameters() {
  // The rank that took the most synchronised steps holds the final weights (ties: lowest
  // rank); encode (steps, -rank) in one integer so a single max all-reduce finds it.
  const int64_t size = comm_->size();
  int64_t key = syncedSteps_ * size + (size - 1 - comm_->rank());
  comm_->allreduce(&key, &key, 1, DType::I64, comm::ReduceOp::Max, options_.collective);
  const int root = static_cast<int>(size - 1 - key % size);
  const int savedRoot = options_.rootRank;
  options_.rootRank = root;
  broadcastFromRoot();
  options_.rootRank = savedRoot;
  if (options_.broadcastBuffers) broadcastBuffers(root);
}

}  // namespace kolo::parallel
