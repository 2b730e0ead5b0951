// A launcher's watch for another node's failure: one request parked at the job's store,
// answered when the failure key is set, instead of asking the store every 200 ms (with
// 12,500 hosts that was 62,500 requests a second at the root).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "kolo/comm/stores.h"

namespace kolo::parallel::detail {

class FailureWatch {
 public:
  /// Connects its own client to the store at `address` (a parked request would hold up
  /// every other request on a shared connection) and watches `key` from a thread.
  FailureWatch(const std::string& address, const std::string& token, std::string key,
               std::chrono::milliseconds connectTimeout);
  /// Interrupts the parked request and joins the thread.
  ~FailureWatch();
  FailureWatch(const FailureWatch&) = delete;
  FailureWatch& operator=(const FailureWatch&) = delete;

  /// Readable once there is news; for the launcher's poll loop.
  int fd() const { return pipe_[0]; }
  struct News {
    std::string what;  // the failure published under the key, or why the store was lost
    bool storeLost = false;
  };
  /// nullopt while the key is not set and the store is there.
  std::optional<News> news();

 private:
  void run();
  void tell(News news);

  std::shared_ptr<comm::TcpStoreClient> client_;
  std::string key_;
  int pipe_[2] = {-1, -1};
  std::mutex mutex_;
  std::optional<News> news_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kolo::parallel::detail
