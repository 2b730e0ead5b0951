// NativeCommunicator: kolo::comm::Communicator over the native progress engine. Blocking
// collectives run on the caller's thread; non-blocking ones on a progress thread in start
// order (a blocking call made while some are pending queues behind them). Sub-groups from
// split() share the parent's engine and connections under their own context id.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/hierarchical.h"
#include "comm/native/group_links.h"
#include "kolo/comm/communicator.h"
#include "kolo/comm/native.h"

namespace kolo::comm::native {

class HostSegment;

/// What every communicator built from one rendezvous shares.
struct JobState {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<HostSegment> segment;
  /// Per engine rank: process id and host index.
  std::vector<int> pids;
  std::vector<int> hostOf;
  /// Cross-memory attach works between every pair of ranks that share a host.
  bool cmaUsable = false;
  /// KOLO_ALGO (Auto when unset).
  Algorithm envAlgorithm = Algorithm::Auto;
  /// This host's ranks outnumber the CPUs they may run on together (waits then yield soon,
  /// and Auto avoids the all-to-all "direct" all-reduce, which needs every peer scheduled).
  bool oversubscribed = false;
  /// Minimum bytes for the single-copy shared-host all-reduce under Auto.
  size_t cmaThresholdBytes = 64 * 1024;
  /// The word peers read to test cross-memory attach during rendezvous.
  std::shared_ptr<uint64_t> probe;
};

class NativeCommunicator : public Communicator {
 public:
  NativeCommunicator(std::shared_ptr<JobState> job, std::unique_ptr<GroupLinks> links,
                     std::chrono::milliseconds timeout);
  ~NativeCommunicator() override;

  int rank() const override { return links_->rank(); }
  int size() const override { return links_->size(); }
  std::string backendName() const override { return "native"; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(timeoutMs_.load()); }
  void setTimeout(std::chrono::milliseconds timeout) override;
  std::shared_ptr<Communicator> split(int color, int key) override;
  /// POSIX shared memory when the whole group is on this host.
  std::shared_ptr<SharedWindow> allocateSharedWindow(size_t bytes) override;

  void send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) override;
  void recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) override;
  std::unique_ptr<Work> isend(const void* buf, size_t count, DType dtype, int peer, int tag = 0) override;
  std::unique_ptr<Work> irecv(void* buf, size_t count, DType dtype, int peer, int tag = 0) override;

  void allreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                 const CollectiveOptions& opts = {}) override;
  std::unique_ptr<Work> iallreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                                   const CollectiveOptions& opts = {}) override;
  void reduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
              const CollectiveOptions& opts = {}) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveOptions& opts = {}) override;
  std::unique_ptr<Work> ibroadcast(void* buf, size_t count, DType dtype, int root,
                                   const CollectiveOptions& opts = {}) override;
  void allgather(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                 const CollectiveOptions& opts = {}) override;
  void allgatherv(const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvcounts, DType dtype,
                  const CollectiveOptions& opts = {}) override;
  void reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype, ReduceOp op,
                     const CollectiveOptions& opts = {}) override;
  void gather(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
              const CollectiveOptions& opts = {}) override;
  void scatter(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
               const CollectiveOptions& opts = {}) override;
  void alltoall(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                const CollectiveOptions& opts = {}) override;
  void barrier(const CollectiveOptions& opts = {}) override;

  /// What an all-reduce of `bytes` on this group runs: "cma" (single-copy shared-host),
  /// "direct" (one message per pair), or an Algorithm name. For benchmarks and tests.
  std::string allreducePlan(Algorithm requested, size_t bytes) const;
  /// How the waits of this communicator's engine (shared with its splits) ended so far.
  Engine::WaitCounts waitCounts() const { return links_->engine()->waitCounts(); }
  /// Whether this host's ranks outnumber the CPUs they may use (JobState::oversubscribed).
  bool oversubscribed() const { return job_->oversubscribed; }
  /// Whether ranks on one host read each other's buffers directly (cross-memory attach).
  bool crossMemoryAttach() const { return job_->cmaUsable; }
  /// Number of distinct hosts in this group.
  int hostCount() const { return hostCount_; }

 private:
  /// Posts a receive from `peer` or, for kAnySource, from whichever other rank sends first.
  std::unique_ptr<Work> postRecv(void* buf, size_t count, DType dtype, int peer, int tag);
  struct Task;
  struct WorkState;
  class TaskWork;

  /// Runs body as collective #next with signature sig: inline when nothing is queued,
  /// else behind the queued non-blocking operations.
  void runBlocking(const Signature& sig, const CollectiveOptions& opts, std::function<void()> body);
  std::unique_ptr<Work> runAsync(const Signature& sig, const CollectiveOptions& opts, std::function<void()> body);
  void execute(Task& task);
  /// Runs a task's body on this thread with its flight-recorder entry and timeline span;
  /// a Timeout or Mismatch also dumps the flight recorder (kolo/flight_recorder.h).
  /// `started`: its flight-recorder entry already says so.
  void runTask(Task& task, bool started);
  /// Enters a collective in the flight recorder as queued (or started: `startNow`);
  /// returns its entry's id.
  uint64_t recordIssued(const Signature& sig, uint64_t seq, bool startNow) const;
  void progressLoop();
  std::chrono::milliseconds budget(const CollectiveOptions& opts) const;
  Algorithm requested(const CollectiveOptions& opts) const;
  void checkRoot(int root, const char* what) const;
  void allreduceBody(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, Algorithm algo);
  void broadcastBody(void* buf, size_t count, DType dtype, int root, Algorithm algo);
  bool allOnOneHost() const { return hostCount_ == 1; }
  enum class PlanKind { Copy, Cma, Direct, Algorithm };
  struct Plan {
    PlanKind kind;
    Algorithm algorithm;  // with PlanKind::Algorithm
  };
  /// What allreducePlan names, without building strings on every call.
  Plan planAllreduce(Algorithm requested, size_t bytes) const;
  /// Stamps the hierarchical sub-links (built on first use) like links_.
  detail::HierarchicalGroups& hierarchicalGroups();

  std::shared_ptr<JobState> job_;
  std::unique_ptr<GroupLinks> links_;
  std::vector<int> groupPids_;
  uint64_t windowCount_ = 0;  // names this communicator's shared windows apart
  int hostCount_ = 1;
  std::unique_ptr<GroupLinks> localLinks_;
  std::unique_ptr<GroupLinks> leaderLinks_;
  std::unique_ptr<GroupLinks> railLinks_;
  /// Receive blocks of the direct all-reduce, kept between calls (collectives run one at a time).
  std::vector<char> directScratch_;
  std::unique_ptr<detail::HierarchicalGroups> hierarchy_;
  std::atomic<int64_t> timeoutMs_;
  uint32_t splits_ = 0;

  std::mutex queueMutex_;
  std::condition_variable queueCv_;
  std::deque<std::shared_ptr<Task>> queue_;
  size_t pending_ = 0;  // queued or running asynchronous tasks
  uint64_t nextSeq_ = 0;
  bool stopping_ = false;
  std::thread progressThread_;
  std::mutex runMutex_;  // held while a collective executes
  // The first Timeout, PeerError or IoError of a collective (guarded by runMutex_; the
  // peers were told with an Abort that this rank gave up): the ranks no longer agree on the sequence of operations, so every later one fails at once with it
  // instead of waiting out a deadline of its own.
  std::string broken_;
};

}  // namespace kolo::comm::native
