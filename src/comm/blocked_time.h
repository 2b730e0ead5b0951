// The time a thread spends blocked in communication (comm::blockedSeconds): each place where a
// caller waits for an operation opens a BlockedTime; nested ones (a blocking call made of a
// non-blocking one and its wait) count once.
#pragma once

#include <chrono>

namespace kolo::comm::detail {

class BlockedTime {
 public:
  BlockedTime();
  ~BlockedTime();
  BlockedTime(const BlockedTime&) = delete;
  BlockedTime& operator=(const BlockedTime&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

/// comm::blockedSeconds of the calling thread.
double blockedSecondsOfThisThread();

}  // namespace kolo::comm::detail
