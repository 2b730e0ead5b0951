// NativeCommunicator: collectives, point-to-point, split and the progress thread.
#include "comm/native/native_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "comm/algorithms/algorithms.h"
#include "comm/native/basic_algorithms.h"
#include "comm/native/cma_allreduce.h"
#include "comm/observed_ops.h"
#include "comm/shared_window.h"
#include "kolo/error.h"
#include "kolo/flight_recorder.h"
#include "kolo/trace.h"

namespace kolo::comm::native {

using detail::BlockedTime;
using detail::dumpFlightRecorder;
using detail::observeWork;
using detail::observedBlocking;
using detail::PendingOp;
using detail::pointToPoint;

struct NativeCommunicator::WorkState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

struct NativeCommunicator::Task {
  Signature sig;
  uint64_t seq = 0;
  uint64_t flightId = 0;  // its flight-recorder entry
  std::chrono::milliseconds budget{0};
  std::function<void()> body;
  std::shared_ptr<WorkState> state;
};

/// Handle of a collective queued on the progress thread.
class NativeCommunicator::TaskWork : public Work {
 public:
  TaskWork(std::shared_ptr<WorkState> state, std::string what, std::chrono::milliseconds budget, uint64_t flightId)
      : state_(std::move(state)), what_(std::move(what)), budget_(budget), flightId_(flightId) {}
  ~TaskWork() override {
    // The progress thread still uses the caller's buffers: never abandon them silently.
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait_for(lock, budget_ * 2, [&] { return state_->done; });
  }
  void wait(std::chrono::milliseconds timeout) override {
    const BlockedTime blocked;
    const auto limit = timeout.count() > 0 ? timeout : budget_;
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->cv.wait_for(lock, limit, [&] { return state_->done; })) {
      lock.unlock();
      const Timeout error(::kolo::detail::concat(what_, ": not complete after ",
                                         static_cast<double>(limit.count()) / 1000.0, " s"));
      dumpFlightRecorder(flightId_, error.what(), "timeout");
      throw error;
    }
    if (state_->error) std::rethrow_exception(state_->error);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done;
  }

 private:
  std::shared_ptr<WorkState> state_;
  std::string what_;
  std::chrono::milliseconds budget_;
  uint64_t flightId_;
};

NativeCommunicator::NativeCommunicator(std::shared_ptr<JobState> job, std::unique_ptr<GroupLinks> links,
                                       std::chrono::milliseconds timeout)
    : job_(std::move(job)), links_(std::move(links)), timeoutMs_(timeout.count()) {
  std::vector<int> hosts;
  for (int r = 0; r < links_->size(); ++r) {
    groupPids_.push_back(job_->pids[links_->engineRank(r)]);
    const int h = job_->hostOf[links_->engineRank(r)];
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  hostCount_ = static_cast<int>(hosts.size());
}

NativeCommunicator::~NativeCommunicator() {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    stopping_ = true;
  }
  queueCv_.notify_all();
  if (progressThread_.joinable()) progressThread_.join();
}

void NativeCommunicator::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) KOLO_THROW(InvalidArgument, "timeout must be positive, got ", timeout.count(), " ms");
  timeoutMs_.store(timeout.count());
}

std::chrono::milliseconds NativeCommunicator::budget(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : timeout();
}

Algorithm NativeCommunicator::requested(const CollectiveOptions& opts) const {
  return opts.algorithm != Algorithm::Auto ? opts.algorithm : job_->envAlgorithm;
}

void NativeCommunicator::checkRoot(int root, const char* what) const {
  if (root < 0 || root >= size())
    KOLO_THROW(InvalidArgument, what, " on rank ", rank(), ": root ", root, " outside the group of ", size());
}

detail::HierarchicalGroups& NativeCommunicator::hierarchicalGroups() {
  if (!hierarchy_) {
    // Local group: this host's ranks in group order. Leaders: each host's first rank, hosts
    // in order of their first rank. Rail (when every host has as many ranks): the ranks
    // with this rank's local index, hosts in the same order. All are known to every rank
    // without communication.
    const int me = rank();
    const int myHost = job_->hostOf[links_->engineRank(me)];
    std::vector<int> localMembers, leaderMembers, seenHosts;
    std::vector<std::vector<int>> hostMembers;  // per host (in seenHosts order): engine ranks
    int localRank = 0, leaderRank = -1;
    for (int r = 0; r < size(); ++r) {
      const int h = job_->hostOf[links_->engineRank(r)];
      if (h == myHost) {
        if (r == me) localRank = static_cast<int>(localMembers.size());
        localMembers.push_back(links_->engineRank(r));
      }
      auto seen = std::find(seenHosts.begin(), seenHosts.end(), h);
      if (seen == seenHosts.end()) {
        seenHosts.push_back(h);
        hostMembers.emplace_back();
        if (r == me) leaderRank = static_cast<int>(leaderMembers.size());
        leaderMembers.push_back(links_->engineRank(r));
        seen = seenHosts.end() - 1;
      }
      hostMembers[static_cast<size_t>(seen - seenHosts.begin())].push_back(links_->engineRank(r));
    }
    bool evenHosts = true;
    for (const auto& members : hostMembers) evenHosts = evenHosts && members.size() == localMembers.size();
    const uint32_t ctx = links_->context();
    if (evenHosts) {
      std::vector<int> railMembers;
      int railRank = 0;
      for (size_t h = 0; h < hostMembers.size(); ++h) {
        if (seenHosts[h] == myHost) railRank = static_cast<int>(h);
        railMembers.push_back(hostMembers[h][static_cast<size_t>(localRank)]);
      }
      std::vector<bool> same(railMembers.size(), false);
      same[static_cast<size_t>(railRank)] = true;
      railLinks_ = std::make_unique<GroupLinks>(links_->engine(), std::move(railMembers), railRank,
                                                ctx * 0x2545f491u + 0x95u + static_cast<uint32_t>(localRank),
                                                std::move(same));
    }
    localLinks_ = std::make_unique<GroupLinks>(links_->engine(), localMembers, localRank, ctx * 0x27d4eb2du + 0x51u,
                                               std::vector<bool>(localMembers.size(), true));
    if (leaderRank >= 0) {
      std::vector<bool> same(leaderMembers.size(), false);
      same[static_cast<size_t>(leaderRank)] = true;
      leaderLinks_ = std::make_unique<GroupLinks>(links_->engine(), leaderMembers, leaderRank,
                                                  ctx * 0x165667b1u + 0x73u, std::move(same));
    }
    hierarchy_ = std::make_unique<detail::HierarchicalGroups>();
    hierarchy_->local = localLinks_.get();
    hierarchy_->leaders = leaderLinks_.get();
    hierarchy_->localRoot = 0;
    hierarchy_->worldSize = size();
    hierarchy_->rail = railLinks_.get();
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(links_->deadline() - Clock::now());
  const auto budget = std::max(std::chrono::milliseconds(1), left);
  localLinks_->begin(links_->signature(), links_->seq(), budget);
  if (leaderLinks_) leaderLinks_->begin(links_->signature(), links_->seq(), budget);
  if (railLinks_) railLinks_->begin(links_->signature(), links_->seq(), budget);
  return *hierarchy_;
}

// ---- execution order ----

uint64_t NativeCommunicator::recordIssued(const Signature& sig, uint64_t seq, bool startNow) const {
  if (!flight::enabled()) return 0;
  const bool reduces = sig.collective == CollectiveKind::Allreduce || sig.collective == CollectiveKind::Reduce ||
                       sig.collective == CollectiveKind::ReduceScatter;
  flight::Description d;
  d.seq = static_cast<int64_t>(seq);
  d.context = links_->context();
  d.groupRank = rank();
  d.groupSize = size();
  d.op = collectiveName(sig.collective);
  d.dtype = dtypeName(sig.dtype);
  d.reduce = reduces ? reduceOpName(sig.op) : "";
  d.algorithm = algorithmName(sig.algorithm);
  d.count = static_cast<int64_t>(sig.count);
  d.bytes = static_cast<int64_t>(sig.count * dtypeSize(sig.dtype));
  d.root = sig.root;
  return flight::begin(d, startNow);
}

void NativeCommunicator::runTask(Task& task, bool started) {
  if (!started) flight::started(task.flightId);
  trace::Scope span(collectiveName(task.sig.collective), "comm");
  span.seq(static_cast<int64_t>(task.seq))
      .bytes(static_cast<int64_t>(task.sig.count * dtypeSize(task.sig.dtype)))
      .detail(algorithmName(task.sig.algorithm));
  try {
    if (!broken_.empty())
      KOLO_THROW(PeerError, collectiveName(task.sig.collective), " #", task.seq, " on rank ", rank(),
                 ": not run, an earlier collective failed (", broken_, ")");
    links_->begin(task.sig, task.seq, task.budget);
    task.body();
  } catch (const Timeout& e) {
    if (broken_.empty()) broken_ = e.what();
    // The peers still waiting on this rank fail now, not at their own deadlines: whatever
    // step failed (the engine's wait, a peer's memory over cross-memory attach), the
    // engine tells them once.
    links_->engine()->abort(e.what(), GaveUp::TimedOut);
    dumpFlightRecorder(task.flightId, e.what(), "timeout");
    throw;
  } catch (const PeerError& e) {
    if (broken_.empty()) broken_ = e.what();
    links_->engine()->abort(e.what(), GaveUp::PeerLost);
    flight::failed(task.flightId, e.what());
    throw;
  } catch (const IoError& e) {
    if (broken_.empty()) broken_ = e.what();  // the peers are told this rank gave up
    links_->engine()->abort(e.what(), GaveUp::PeerLost);
    flight::failed(task.flightId, e.what());
    throw;
  } catch (const Mismatch& e) {
    // Ranks that called different collectives or sizes: the peers that did not see the
    // disagreement themselves wait on this rank or on one waiting on it; told now, each
    // fails with a Mismatch naming both sides instead of waiting out its deadline.
    if (broken_.empty()) broken_ = e.what();
    links_->engine()->abort(e.what(), GaveUp::Disagreed);
    dumpFlightRecorder(task.flightId, e.what(), "mismatch");
    throw;
  } catch (const std::exception& e) {
    flight::failed(task.flightId, e.what());
    throw;
  }
  flight::finished(task.flightId);
}

void NativeCommunicator::execute(Task& task) {
  std::lock_guard<std::mutex> run(runMutex_);
  runTask(task, false);
}

void NativeCommunicator::runBlocking(const Signature& sig, const CollectiveOptions& opts, std::function<void()> body) {
  const BlockedTime blocked;
  Task task{sig, 0, 0, budget(opts), std::move(body), nullptr};
  std::unique_lock<std::mutex> lock(queueMutex_);
  task.seq = nextSeq_++;
  task.flightId = recordIssued(sig, task.seq, pending_ == 0);
  if (pending_ == 0) {
    // Nothing queued: run here. Taking runMutex_ before releasing the queue lock keeps
    // a concurrently started non-blocking operation behind us.
    std::unique_lock<std::mutex> run(runMutex_);
    lock.unlock();
    runTask(task, true);
    return;
  }
  auto state = std::make_shared<WorkState>();
  auto queued = std::make_shared<Task>(std::move(task));
  queued->state = state;
  queue_.push_back(queued);
  ++pending_;
  lock.unlock();
  queueCv_.notify_all();
  std::unique_lock<std::mutex> wait(state->mutex);
  state->cv.wait(wait, [&] { return state->done; });
  if (state->error) std::rethrow_exception(state->error);
}

std::unique_ptr<Work> NativeCommunicator::runAsync(const Signature& sig, const CollectiveOptions& opts,
                                                   std::function<void()> body) {
  auto task = std::make_shared<Task>();
  task->sig = sig;
  task->budget = budget(opts);
  task->body = std::move(body);
  task->state = std::make_shared<WorkState>();
  std::string what;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    task->seq = nextSeq_++;
    task->flightId = recordIssued(sig, task->seq, false);
    what = std::string(collectiveName(sig.collective)) + " #" + std::to_string(task->seq) + " on rank " +
           std::to_string(rank());
    queue_.push_back(task);
    ++pending_;
    if (!progressThread_.joinable()) progressThread_ = std::thread([this] {
      trace::setThreadName("comm progress");
      progressLoop();
    });
  }
  queueCv_.notify_all();
  if (trace::enabled()) {
    trace::Span queued;
    queued.name = "queued";
    queued.category = "comm";
    queued.begin = queued.end = trace::nowNs();
    queued.seq = static_cast<int64_t>(task->seq);
    queued.detail = collectiveName(sig.collective);
    queued.instant = true;
    trace::record(queued);
  }
  return std::make_unique<TaskWork>(task->state, what, task->budget, task->flightId);
}

void NativeCommunicator::progressLoop() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(queueMutex_);
      queueCv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = queue_.front();
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      execute(*task);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(task->state->mutex);
      task->state->done = true;
      task->state->error = error;
    }
    task->state->cv.notify_all();
    std::lock_guard<std::mutex> lock(queueMutex_);
    --pending_;
  }
}

// ---- point to point ----

// Blocking sends and receives are one span each on the calling thread; non-blocking ones an
// entry and an asynchronous span, finished by whichever wait() or test() sees them complete.

void NativeCommunicator::send(const void* buf, size_t count, DType dtype, int peer, int tag) {
  if (peer == rank()) KOLO_THROW(InvalidArgument, "send on rank ", rank(), ": sending to oneself is not supported");
  observedBlocking(pointToPoint("send", rank(), size(), links_->context(), count, dtype, peer),
                   [&] { links_->sendTagged(peer, tag, buf, count, dtype, timeout(), "send")->wait(); });
}

void NativeCommunicator::recv(void* buf, size_t count, DType dtype, int peer, int tag) {
  if (peer == rank()) KOLO_THROW(InvalidArgument, "recv on rank ", rank(), ": receiving from oneself is not supported");
  observedBlocking(pointToPoint("recv", rank(), size(), links_->context(), count, dtype, peer),
                   [&] { postRecv(buf, count, dtype, peer, tag)->wait(); });
}

std::unique_ptr<Work> NativeCommunicator::postRecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  if (peer == kAnySource) return links_->recvTaggedAny(tag, buf, count, dtype, timeout(), "recv");
  return links_->recvTagged(peer, tag, buf, count, dtype, timeout(), "recv");
}

std::unique_ptr<Work> NativeCommunicator::isend(const void* buf, size_t count, DType dtype, int peer, int tag) {
  if (peer == rank()) KOLO_THROW(InvalidArgument, "send on rank ", rank(), ": sending to oneself is not supported");
  PendingOp op(pointToPoint("isend", rank(), size(), links_->context(), count, dtype, peer));
  try {
    return observeWork(links_->sendTagged(peer, tag, buf, count, dtype, timeout(), "send"), std::move(op));
  } catch (const std::exception& e) {
    op.fail(e, true);
    throw;
  }
}

std::unique_ptr<Work> NativeCommunicator::irecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  if (peer == rank()) KOLO_THROW(InvalidArgument, "recv on rank ", rank(), ": receiving from oneself is not supported");
  PendingOp op(pointToPoint("irecv", rank(), size(), links_->context(), count, dtype, peer));
  try {
    return observeWork(postRecv(buf, count, dtype, peer, tag), std::move(op));
  } catch (const std::exception& e) {
    op.fail(e, true);
    throw;
  }
}

// ---- collectives ----

namespace {
// Auto sends all-reduces up to this size with one message per pair of ranks (groups of
// up to kDirectMaxRanks, each with a CPU): a single round trip beats log2(p) rounds while
// messages are small. Oversubscribed ranks take halving-doubling: its pairwise rounds need
// fewer context switches than waiting on every peer at once.
constexpr size_t kDirectMaxBytes = 16 * 1024;
constexpr int kDirectMaxRanks = 4;
}  // namespace

NativeCommunicator::Plan NativeCommunicator::planAllreduce(Algorithm requested, size_t bytes) const {
  if (size() == 1) return {PlanKind::Copy, Algorithm::Auto};
  if (requested == Algorithm::Auto) {
    if (job_->cmaUsable && allOnOneHost() && bytes >= job_->cmaThresholdBytes) return {PlanKind::Cma, Algorithm::Auto};
    if (bytes <= kDirectMaxBytes && size() <= kDirectMaxRanks && allOnOneHost() && !job_->oversubscribed)
      return {PlanKind::Direct, Algorithm::Auto};
    requested = detail::chooseAllreduceAlgorithm(bytes, size(), hostCount_);
  }
  if (requested == Algorithm::Hierarchical && hostCount_ == 1) requested = Algorithm::Ring;
  return {PlanKind::Algorithm, requested};
}

std::string NativeCommunicator::allreducePlan(Algorithm requested, size_t bytes) const {
  const Plan plan = planAllreduce(requested, bytes);
  switch (plan.kind) {
    case PlanKind::Copy: return "copy";
    case PlanKind::Cma: return "cma";
    case PlanKind::Direct: return "direct";
    case PlanKind::Algorithm: break;
  }
  return algorithmName(plan.algorithm);
}

void NativeCommunicator::allreduceBody(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                                       Algorithm algo) {
  const size_t bytes = count * dtypeSize(dtype);
  const Plan plan = planAllreduce(algo, bytes);
  // The timeline names what ran: the plan, or the algorithm Auto chose.
  trace::Scope span(plan.kind == PlanKind::Cma      ? "cma"
                    : plan.kind == PlanKind::Direct ? "direct"
                    : plan.kind == PlanKind::Copy   ? "copy"
                                                    : algorithmName(plan.algorithm),
                    "algorithm");
  span.bytes(static_cast<int64_t>(bytes));
  if (plan.kind == PlanKind::Copy) {
    if (sendbuf != recvbuf) std::memcpy(recvbuf, sendbuf, bytes);
    return;
  }
  if (plan.kind == PlanKind::Cma) return cmaAllreduce(*links_, groupPids_, sendbuf, recvbuf, count, dtype, op);
  if (plan.kind == PlanKind::Direct) return directAllreduce(*links_, sendbuf, recvbuf, count, dtype, op, directScratch_);
  const Algorithm chosen = plan.algorithm;
  if (chosen == Algorithm::Hierarchical) {
    return detail::hierarchicalAllreduce(hierarchicalGroups(), sendbuf, recvbuf, count, dtype, op);
  }
  detail::allreduce(*links_, sendbuf, recvbuf, count, dtype, op, chosen);
}

void NativeCommunicator::allreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                                   const CollectiveOptions& opts) {
  if (count == 0) return;
  const Algorithm algo = requested(opts);
  Signature sig{CollectiveKind::Allreduce, dtype, op, algo, -1, count};
  runBlocking(sig, opts, [=, this] { allreduceBody(sendbuf, recvbuf, count, dtype, op, algo); });
}

std::unique_ptr<Work> NativeCommunicator::iallreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                                                     ReduceOp op, const CollectiveOptions& opts) {
  const Algorithm algo = requested(opts);
  Signature sig{CollectiveKind::Allreduce, dtype, op, algo, -1, count};
  return runAsync(sig, opts, [=, this] {
    if (count > 0) allreduceBody(sendbuf, recvbuf, count, dtype, op, algo);
  });
}

void NativeCommunicator::reduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
                                const CollectiveOptions& opts) {
  checkRoot(root, "reduce");
  if (count == 0) return;
  Signature sig{CollectiveKind::Reduce, dtype, op, requested(opts), root, count};
  runBlocking(sig, opts, [=, this] {
    if (size() == 1) {
      if (sendbuf != recvbuf) std::memcpy(recvbuf, sendbuf, count * dtypeSize(dtype));
      return;
    }
    detail::reduce(*links_, sendbuf, recvbuf, count, dtype, op, root);
  });
}

void NativeCommunicator::broadcastBody(void* buf, size_t count, DType dtype, int root, Algorithm algo) {
  if (size() == 1 || count == 0) return;
  detail::broadcast(*links_, buf, count * dtypeSize(dtype), root);
}

void NativeCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveOptions& opts) {
  checkRoot(root, "broadcast");
  if (count == 0) return;
  const Algorithm algo = requested(opts);
  Signature sig{CollectiveKind::Broadcast, dtype, ReduceOp::Sum, algo, root, count};
  runBlocking(sig, opts, [=, this] { broadcastBody(buf, count, dtype, root, algo); });
}

std::unique_ptr<Work> NativeCommunicator::ibroadcast(void* buf, size_t count, DType dtype, int root,
                                                     const CollectiveOptions& opts) {
  checkRoot(root, "ibroadcast");
  const Algorithm algo = requested(opts);
  Signature sig{CollectiveKind::Broadcast, dtype, ReduceOp::Sum, algo, root, count};
  return runAsync(sig, opts, [=, this] { broadcastBody(buf, count, dtype, root, algo); });
}

void NativeCommunicator::allgather(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                                   const CollectiveOptions& opts) {
  if (count == 0) return;
  Signature sig{CollectiveKind::Allgather, dtype, ReduceOp::Sum, requested(opts), -1, count};
  runBlocking(sig, opts, [=, this] {
    detail::ringAllgather(*links_, sendbuf, recvbuf, count * dtypeSize(dtype));
  });
}

void NativeCommunicator::allgatherv(const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvcounts,
                                    DType dtype, const CollectiveOptions& opts) {
  if (recvcounts.size() != static_cast<size_t>(size()))
    KOLO_THROW(InvalidArgument, "allgatherv on rank ", rank(), ": ", recvcounts.size(), " counts for a group of ",
               size());
  size_t total = 0;
  for (size_t c : recvcounts) total += c;
  if (total == 0) return;
  Signature sig{CollectiveKind::Allgatherv, dtype, ReduceOp::Sum, requested(opts), -1, total};
  std::vector<size_t> blocks;
  for (size_t c : recvcounts) blocks.push_back(c * dtypeSize(dtype));
  runBlocking(sig, opts, [=, this] { detail::ringAllgatherv(*links_, sendbuf, recvbuf, blocks); });
}

void NativeCommunicator::reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype, ReduceOp op,
                                       const CollectiveOptions& opts) {
  if (recvcount == 0) return;
  Signature sig{CollectiveKind::ReduceScatter, dtype, op, requested(opts), -1, recvcount};
  runBlocking(sig, opts, [=, this] { detail::reduceScatter(*links_, sendbuf, recvbuf, recvcount, dtype, op); });
}

void NativeCommunicator::gather(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
                                const CollectiveOptions& opts) {
  checkRoot(root, "gather");
  if (count == 0) return;
  Signature sig{CollectiveKind::Gather, dtype, ReduceOp::Sum, requested(opts), root, count};
  runBlocking(sig, opts,
              [=, this] { detail::gather(*links_, sendbuf, recvbuf, count * dtypeSize(dtype), root); });
}

void NativeCommunicator::scatter(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
                                 const CollectiveOptions& opts) {
  checkRoot(root, "scatter");
  if (count == 0) return;
  Signature sig{CollectiveKind::Scatter, dtype, ReduceOp::Sum, requested(opts), root, count};
  runBlocking(sig, opts,
              [=, this] { detail::scatter(*links_, sendbuf, recvbuf, count * dtypeSize(dtype), root); });
}

void NativeCommunicator::alltoall(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                                  const CollectiveOptions& opts) {
  if (count == 0) return;
  Signature sig{CollectiveKind::Alltoall, dtype, ReduceOp::Sum, requested(opts), -1, count};
  runBlocking(sig, opts, [=, this] { detail::alltoall(*links_, sendbuf, recvbuf, count * dtypeSize(dtype)); });
}

void NativeCommunicator::barrier(const CollectiveOptions& opts) {
  Signature sig{CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, Algorithm::Auto, -1, 0};
  runBlocking(sig, opts, [this] { detail::disseminationBarrier(*links_); });
}

// ---- shared window ----

std::shared_ptr<SharedWindow> NativeCommunicator::allocateSharedWindow(size_t bytes) {
  // Whether the group shares one host is known alike on every rank: no message needed.
  for (int r = 0; r < size(); ++r)
    if (r != rank() && !links_->sameHost(r)) return nullptr;
  return detail::allocatePosixSharedWindow(
      *this, bytes, reinterpret_cast<uintptr_t>(this) * 1000003u + windowCount_++);
}

// ---- split ----

std::shared_ptr<Communicator> NativeCommunicator::split(int color, int key) {
  const int n = size();
  std::vector<int64_t> table(static_cast<size_t>(n) * 2);
  int64_t mine[2] = {color, key};
  Signature sig{CollectiveKind::Split, DType::I64, ReduceOp::Sum, Algorithm::Auto, -1, 2};
  runBlocking(sig, {}, [&, this] {
    std::vector<size_t> blocks(static_cast<size_t>(n), sizeof(mine));
    directAllgatherv(*links_, mine, table.data(), blocks);
  });
  const uint32_t splitIndex = ++splits_;
  if (color < 0) return nullptr;
  std::vector<std::tuple<int64_t, int>> order;  // (key, old rank) of my color
  for (int r = 0; r < n; ++r)
    if (table[2 * r] == color) order.emplace_back(table[2 * r + 1], r);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  std::vector<bool> sameHost;
  int newRank = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int old = std::get<1>(order[i]);
    if (old == rank()) newRank = static_cast<int>(i);
    members.push_back(links_->engineRank(old));
    sameHost.push_back(links_->sameHost(old) || old == rank());
  }
  // Context ids only have to differ between groups that share a pair of ranks; mixing the
  // parent's id, the split's index and the color is deterministic on every member.
  uint32_t ctx = links_->context() * 0x9e3779b1u + splitIndex * 0x85ebca6bu + static_cast<uint32_t>(color) * 0xc2b2ae35u;
  ctx ^= ctx >> 15;
  if (ctx < 2) ctx += 2;
  auto links = std::make_unique<GroupLinks>(links_->engine(), std::move(members), newRank, ctx, std::move(sameHost));
  return std::make_shared<NativeCommunicator>(job_, std::move(links), timeout());
}

}  // namespace kolo::comm::native
