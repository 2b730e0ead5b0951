// Test double of the Links seam: ranks are threads of one process, and every ordered pair
// of ranks has a queue of messages. Sends are either buffered (complete at once) or
// rendezvous (complete only when the receiver has taken the message), so algorithms are
// tested against both behaviours the seam allows. Every wait has a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/links.h"

namespace kolo::comm::testing {

enum class SendMode { Buffered, Rendezvous };

/// The shared state of one group of `size` thread ranks.
class Fabric {
 public:
  /// hostOf[r] names rank r's simulated host (for sameHost); empty: all on one host.
  Fabric(int size, SendMode mode, std::chrono::milliseconds deadline = std::chrono::seconds(20),
         std::vector<int> hostOf = {});
  ~Fabric();
  int size() const { return size_; }
  /// A Links view for one rank; the Fabric must outlive it.
  std::unique_ptr<detail::Links> links(int rank);
  /// Wakes every waiter with an IoError (a rank failed; others must not wait forever).
  void poison(const std::string& why);
  /// Messages sent so far and not yet received (0 after a clean collective).
  size_t undelivered() const;

  struct Channel;
  struct Message;
  Channel& channel(int src, int dst) { return *channels_[static_cast<size_t>(src) * size_ + dst]; }
  bool sameHost(int a, int b) const { return hostOf_.empty() || hostOf_[a] == hostOf_[b]; }
  SendMode mode() const { return mode_; }
  std::chrono::milliseconds deadline() const { return deadline_; }
  bool poisoned(std::string* why) const;

 private:
  int size_;
  SendMode mode_;
  std::chrono::milliseconds deadline_;
  std::vector<int> hostOf_;
  std::vector<std::unique_ptr<Channel>> channels_;
  mutable std::mutex poisonMu_;
  std::string poison_;
};

/// Runs fn(links, rank) on `size` threads over one fabric and rethrows the first failure
/// (after poisoning the fabric so the other ranks stop waiting).
void runRanks(int size, SendMode mode, const std::function<void(detail::Links&, int)>& fn,
              std::vector<int> hostOf = {});

/// Runs fn(rank) on `size` threads; rethrows the first failure. The caller builds the
/// fabrics (hierarchical tests need several per rank); they are poisoned on failure.
void runThreads(int size, const std::vector<Fabric*>& fabrics, const std::function<void(int)>& fn);

}  // namespace kolo::comm::testing
