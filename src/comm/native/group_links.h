// One communicator's view of the engine: group ranks mapped to engine ranks, a context id
// that keeps its frames apart from other groups', and the stamp (sequence number and
// signature) of the collective in progress. It is the Links the algorithms run on, and
// carries point-to-point traffic for the communicator too.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/links.h"
#include "comm/native/engine.h"

namespace kolo::comm::native {

/// Work handle over one engine op. Waiting with a zero timeout uses the handle's default
/// deadline; destroying an unfinished handle withdraws the op.
class EngineWork : public Work {
 public:
  EngineWork(std::shared_ptr<Engine> engine, std::shared_ptr<Op> op, Clock::time_point deadline,
             std::chrono::milliseconds budget);
  ~EngineWork() override;
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  bool test() override;
  /// A complete receive's sender (its group rank); -1 otherwise.
  int source() const override;

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Op> op_;
  Clock::time_point deadline_;
  std::chrono::milliseconds budget_;
  bool done_ = false;
};

class GroupLinks : public kolo::comm::detail::Links {
 public:
  GroupLinks(std::shared_ptr<Engine> engine, std::vector<int> members, int groupRank, uint32_t context,
             std::vector<bool> sameHost);

  int rank() const override { return groupRank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  bool sameHost(int peer) const override { return sameHost_[static_cast<size_t>(peer)]; }
  void send(int peer, const void* data, size_t bytes) override;
  void recv(int peer, void* data, size_t bytes) override;
  std::unique_ptr<Work> isend(int peer, const void* data, size_t bytes) override;
  std::unique_ptr<Work> irecv(int peer, void* data, size_t bytes) override;

  /// Stamps the following traffic as collective #seq with signature sig; waits end at
  /// now + budget.
  void begin(const Signature& sig, uint64_t seq, std::chrono::milliseconds budget);
  const Signature& signature() const { return sig_; }
  uint64_t seq() const { return seq_; }
  Clock::time_point deadline() const { return deadline_; }
  std::chrono::milliseconds budget() const { return budget_; }

  /// Point-to-point message with a tag (not part of any collective).
  std::unique_ptr<Work> sendTagged(int peer, int tag, const void* data, size_t count, DType dtype,
                                   std::chrono::milliseconds budget, const char* what);
  std::unique_ptr<Work> recvTagged(int peer, int tag, void* data, size_t count, DType dtype,
                                   std::chrono::milliseconds budget, const char* what);
  /// recvTagged from whichever other rank of the group sends first (Work::source() names it).
  std::unique_ptr<Work> recvTaggedAny(int tag, void* data, size_t count, DType dtype,
                                      std::chrono::milliseconds budget, const char* what);

  int engineRank(int groupRank) const { return members_[static_cast<size_t>(groupRank)]; }
  const std::vector<int>& members() const { return members_; }
  uint32_t context() const { return context_; }
  const std::shared_ptr<Engine>& engine() const { return engine_; }

 private:
  void checkPeer(int peer) const;
  OpLabel label(int peer) const;

  std::shared_ptr<Engine> engine_;
  std::vector<int> members_;
  int groupRank_;
  uint32_t context_;
  std::vector<bool> sameHost_;
  Signature sig_;
  uint64_t seq_ = 0;
  Clock::time_point deadline_{};
  std::chrono::milliseconds budget_{0};
};

}  // namespace kolo::comm::native
