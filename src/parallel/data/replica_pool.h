// ReplicaPool: K-1 persistent worker threads plus the caller's, running one function per
// replica for every step (the replicas of Mirrored and CentralStorage).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kolo/precision.h"

namespace kolo::parallel::detail {

class ReplicaPool {
 public:
  explicit ReplicaPool(int replicas);
  ~ReplicaPool();
  ReplicaPool(const ReplicaPool&) = delete;
  ReplicaPool& operator=(const ReplicaPool&) = delete;

  /// Runs fn(r) for every replica r (r = 0 on the calling thread), each under the caller's
  /// matmul precision, and returns when all are done; rethrows the first replica's error.
  void run(const std::function<void(int)>& fn);
  int size() const { return replicas_; }

 private:
  void workerLoop(int replica);

  int replicas_;
  std::mutex mutex_;
  std::condition_variable cv_;
  const std::function<void(int)>* task_ = nullptr;
  MatmulPrecision precision_ = MatmulPrecision::F32;  // the caller's, for this task
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace kolo::parallel::detail
