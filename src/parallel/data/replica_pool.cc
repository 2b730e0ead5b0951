// ReplicaPool: persistent replica threads woken per step through a generation counter.
#include "parallel/data/replica_pool.h"

#include "kolo/precision.h"

namespace kolo::parallel::detail {

ReplicaPool::ReplicaPool(int replicas) : replicas_(replicas), errors_(replicas) {
  for (int r = 1; r < replicas; ++r) threads_.emplace_back([this, r] { workerLoop(r); });
}

ReplicaPool::~ReplicaPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReplicaPool::workerLoop(int replica) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    MatmulPrecision precision;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
      precision = precision_;
    }
    std::exception_ptr error;
    try {
      // The replicas compute with the caller's matmul precision (a per-thread setting).
      MatmulPrecisionGuard products(precision);
      (*task)(replica);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    errors_[replica] = error;
    if (--pending_ == 0) cv_.notify_all();
  }
}

void ReplicaPool::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &fn;
    precision_ = matmulPrecision();
    pending_ = replicas_ - 1;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    ++generation_;
  }
  cv_.notify_all();
  try {
    fn(0);
  } catch (...) {
    errors_[0] = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  for (auto& e : errors_)
    if (e) std::rethrow_exception(e);
}

}  // namespace kolo::parallel::detail
