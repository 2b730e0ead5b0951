// In-process replica group: Communicator over K threads whose collectives read and write
// each other's buffers directly (reduce-to-one, hierarchical copy or ring), with a
// deadline on every rendezvous. Elements are combined by the comm layer's reduction
// kernels, so every dtype and op reduces as it does between processes.
#include "kolo/parallel/replica_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::parallel {

const char* localReductionName(LocalReduction reduction) {
  switch (reduction) {
    case LocalReduction::ReduceToOne:
      return "reduce-to-one";
    case LocalReduction::HierarchicalCopy:
      return "hierarchical-copy";
    case LocalReduction::Ring:
      return "ring";
  }
  return "?";
}

LocalReduction parseLocalReduction(const std::string& name) {
  if (name == "reduce-to-one") return LocalReduction::ReduceToOne;
  if (name == "hierarchical-copy" || name == "hierarchical")
    return LocalReduction::HierarchicalCopy;
  if (name == "ring") return LocalReduction::Ring;
  KOLO_THROW(InvalidArgument, "unknown in-process reduction '", name,
             "' (expected reduce-to-one, hierarchical-copy or ring)");
}

namespace {

enum class Kind { Allreduce, Broadcast, Allgather, Barrier };

const char* kindName(Kind k) {
  switch (k) {
    case Kind::Allreduce:
      return "allreduce";
    case Kind::Broadcast:
      return "broadcast";
    case Kind::Allgather:
      return "allgather";
    case Kind::Barrier:
      return "barrier";
  }
  return "?";
}

struct Round {
  Kind kind = Kind::Barrier;
  size_t count = 0;
  DType dtype = DType::F32;
  comm::ReduceOp op = comm::ReduceOp::Sum;
  int root = 0;
  int posted = 0;
  int finished = 0;
  std::vector<const void*> send;
  std::vector<void*> recv;
};

// State shared by the K communicators of one group.
struct GroupState {
  int size = 1;
  LocalReduction reduction = LocalReduction::Ring;
  std::chrono::milliseconds timeout{0};
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t barrierGeneration = 0;
  int barrierCount = 0;
  std::vector<bool> arrived;
  std::string broken;  // set once a deadline passed: every later call fails with it
  std::map<uint64_t, Round> rounds;

  // Every replica passes here between the phases of a collective.
  void barrier(int rank, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!broken.empty()) throw Timeout(broken);
    const uint64_t generation = barrierGeneration;
    arrived[rank] = true;
    if (++barrierCount == size) {
      barrierCount = 0;
      ++barrierGeneration;
      std::fill(arrived.begin(), arrived.end(), false);
      cv.notify_all();
      return;
    }
    const bool ok = cv.wait_for(lock, limit,
                                [&] { return barrierGeneration != generation || !broken.empty(); });
    if (!broken.empty()) throw Timeout(broken);
    if (!ok) {
      std::ostringstream missing;
      for (int r = 0, shown = 0; r < size; ++r)
        if (!arrived[r]) missing << (shown++ ? ", " : "") << r;
      broken =
          detail::concat("replica group: replica(s) ", missing.str(), " did not arrive within ",
                         limit.count(), " ms (seen by replica ", rank, ")");
      cv.notify_all();
      throw Timeout(broken);
    }
  }
};

class ReplicaCommunicator;

class ReplicaWork : public comm::Work {
 public:
  ReplicaWork(ReplicaCommunicator* comm, uint64_t seq) : comm_(comm), seq_(seq) {}
  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

 private:
  ReplicaCommunicator* comm_;
  uint64_t seq_;
};

class ReplicaCommunicator : public comm::Communicator {
 public:
  ReplicaCommunicator(std::shared_ptr<GroupState> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string backendName() const override { return "replica-group"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  std::shared_ptr<Communicator> split(int, int) override { unsupported("split"); }
  void send(const void*, size_t, DType, int, int) override { unsupported("send"); }
  void recv(void*, size_t, DType, int, int) override { unsupported("recv"); }
  std::unique_ptr<comm::Work> isend(const void*, size_t, DType, int, int) override {
    unsupported("isend");
  }
  std::unique_ptr<comm::Work> irecv(void*, size_t, DType, int, int) override {
    unsupported("irecv");
  }

  void allreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, comm::ReduceOp op,
                 const comm::CollectiveOptions& opts) override {
    iallreduce(sendbuf, recvbuf, count, dtype, op, opts)->wait(opts.timeout);
  }
  std::unique_ptr<comm::Work> iallreduce(const void* sendbuf, void* recvbuf, size_t count,
                                         DType dtype, comm::ReduceOp op,
                                         const comm::CollectiveOptions&) override {
    return post(Kind::Allreduce, sendbuf, recvbuf, count, dtype, op, 0);
  }
  void reduce(const void*, void*, size_t, DType, comm::ReduceOp, int,
              const comm::CollectiveOptions&) override {
    unsupported("reduce");
  }
  void broadcast(void* buf, size_t count, DType dtype, int root,
                 const comm::CollectiveOptions& opts) override {
    ibroadcast(buf, count, dtype, root, opts)->wait(opts.timeout);
  }
  std::unique_ptr<comm::Work> ibroadcast(void* buf, size_t count, DType dtype, int root,
                                         const comm::CollectiveOptions&) override {
    KOLO_CHECK(root >= 0 && root < size(), "replica group broadcast: root ", root, " outside [0, ",
               size(), ")");
    return post(Kind::Broadcast, buf, buf, count, dtype, comm::ReduceOp::Sum, root);
  }
  void allgather(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                 const comm::CollectiveOptions& opts) override {
    post(Kind::Allgather, sendbuf, recvbuf, count, dtype, comm::ReduceOp::Sum, 0)
        ->wait(opts.timeout);
  }
  void allgatherv(const void*, void*, const std::vector<size_t>&, DType,
                  const comm::CollectiveOptions&) override {
    unsupported("allgatherv");
  }
  void reduceScatter(const void*, void*, size_t, DType, comm::ReduceOp,
                     const comm::CollectiveOptions&) override {
    unsupported("reduceScatter");
  }
  void gather(const void*, void*, size_t, DType, int, const comm::CollectiveOptions&) override {
    unsupported("gather");
  }
  void scatter(const void*, void*, size_t, DType, int, const comm::CollectiveOptions&) override {
    unsupported("scatter");
  }
  void alltoall(const void*, void*, size_t, DType, const comm::CollectiveOptions&) override {
    unsupported("alltoall");
  }
  void barrier(const comm::CollectiveOptions& opts) override {
    post(Kind::Barrier, nullptr, nullptr, 0, DType::U8, comm::ReduceOp::Sum, 0)->wait(opts.timeout);
  }

  // Runs every posted round up to and including `seq`, in order.
  void completeThrough(uint64_t seq, std::chrono::milliseconds timeout) {
    const auto limit = timeout.count() > 0 ? timeout : timeout_;
    while (completed_ <= seq) {
      runRound(completed_, limit);
      ++completed_;
    }
  }
  bool completed(uint64_t seq) const { return completed_ > seq; }
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(group_->mutex);
    if (group_->broken.empty())
      group_->broken = detail::concat("replica group aborted by replica ", rank_, ": ", reason);
    group_->cv.notify_all();
  }

 private:
  [[noreturn]] void unsupported(const char* what) const {
    KOLO_THROW(InvalidArgument, "replica group: ", what, " is not supported in-process (replica ",
               rank_, ")");
  }

  std::unique_ptr<comm::Work> post(Kind kind, const void* sendbuf, void* recvbuf, size_t count,
                                   DType dtype, comm::ReduceOp op, int root) {
    const uint64_t seq = posted_++;
    {
      std::lock_guard<std::mutex> lock(group_->mutex);
      if (!group_->broken.empty()) throw Timeout(group_->broken);
      Round& round = group_->rounds[seq];
      if (round.posted == 0) {
        round.kind = kind;
        round.count = count;
        round.dtype = dtype;
        round.op = op;
        round.root = root;
        round.send.assign(group_->size, nullptr);
        round.recv.assign(group_->size, nullptr);
      } else if (round.kind != kind || round.count != count || round.dtype != dtype ||
                 round.op != op || round.root != root) {
        KOLO_THROW(Mismatch, "replica group: collective #", seq,
                   " differs between replicas: replica ", rank_, " called ", kindName(kind),
                   "(count ", count, ", ", dtypeName(dtype), ", ", comm::reduceOpName(op), ", root ", root,
                   ") but another called ", kindName(round.kind), "(count ", round.count, ", ",
                   dtypeName(round.dtype), ", ", comm::reduceOpName(round.op), ", root ", round.root, ")");
      }
      round.send[rank_] = sendbuf;
      round.recv[rank_] = recvbuf;
      ++round.posted;
    }
    return std::make_unique<ReplicaWork>(this, seq);
  }

  void runRound(uint64_t seq, std::chrono::milliseconds limit) {
    GroupState& g = *group_;
    g.barrier(rank_, limit);  // every replica has posted this round
    Round* round;
    {
      std::lock_guard<std::mutex> lock(g.mutex);
      round = &g.rounds.at(seq);
    }
    const int k = g.size;
    const size_t esize = round->kind == Kind::Barrier ? 1 : dtypeSize(round->dtype);
    auto sendOf = [&](int r) { return static_cast<const uint8_t*>(round->send[r]); };
    auto recvOf = [&](int r) { return static_cast<uint8_t*>(round->recv[r]); };
    const size_t n = round->count;

    switch (round->kind) {
      case Kind::Barrier:
        break;
      case Kind::Broadcast:
        if (rank_ != round->root && n > 0)
          std::memcpy(recvOf(rank_), recvOf(round->root), n * esize);
        g.barrier(rank_, limit);
        break;
      case Kind::Allgather:
        for (int r = 0; r < k; ++r)
          if (n > 0) std::memcpy(recvOf(rank_) + r * n * esize, sendOf(r), n * esize);
        g.barrier(rank_, limit);
        break;
      case Kind::Allreduce:
        runAllreduce(*round, limit);
        break;
    }
    {
      std::lock_guard<std::mutex> lock(g.mutex);
      if (++round->finished == k) g.rounds.erase(seq);
    }
  }

  void runAllreduce(Round& round, std::chrono::milliseconds limit) {
    GroupState& g = *group_;
    const int k = g.size;
    const size_t n = round.count;
    const size_t esize = dtypeSize(round.dtype);
    auto sendOf = [&](int r) { return static_cast<const uint8_t*>(round.send[r]); };
    auto recvOf = [&](int r) { return static_cast<uint8_t*>(round.recv[r]); };
    auto copyIn = [&](int r) {
      if (n > 0 && round.send[r] != round.recv[r]) std::memcpy(recvOf(r), sendOf(r), n * esize);
    };

    switch (g.reduction) {
      case LocalReduction::ReduceToOne: {
        // Replica 0 reads every input (others' inputs stay untouched until the next barrier).
        if (rank_ == 0) {
          copyIn(0);
          for (int r = 1; r < k; ++r) comm::detail::reduceInto(recvOf(0), sendOf(r), n, round.dtype, round.op);
          if (round.op == comm::ReduceOp::Avg) comm::detail::finishAvg(recvOf(0), n, round.dtype, k);
        }
        g.barrier(rank_, limit);
        if (rank_ != 0 && n > 0) std::memcpy(recvOf(rank_), recvOf(0), n * esize);
        g.barrier(rank_, limit);
        break;
      }
      case LocalReduction::HierarchicalCopy: {
        // Two groups [0, h) and [h, k): each leader sums its group, leader 0 adds leader h,
        // leader h copies the total back, then every member copies from its leader.
        const int h = (k + 1) / 2;
        const int leader = rank_ < h ? 0 : h;
        const int end = rank_ < h ? h : k;
        if (rank_ == leader) {
          copyIn(leader);
          for (int r = leader + 1; r < end; ++r)
            comm::detail::reduceInto(recvOf(leader), sendOf(r), n, round.dtype, round.op);
        }
        g.barrier(rank_, limit);
        if (rank_ == 0) {
          if (h < k) comm::detail::reduceInto(recvOf(0), recvOf(h), n, round.dtype, round.op);
          if (round.op == comm::ReduceOp::Avg) comm::detail::finishAvg(recvOf(0), n, round.dtype, k);
        }
        g.barrier(rank_, limit);
        if (rank_ == h && h < k && n > 0) std::memcpy(recvOf(h), recvOf(0), n * esize);
        g.barrier(rank_, limit);
        if (rank_ != leader && n > 0) std::memcpy(recvOf(rank_), recvOf(leader), n * esize);
        g.barrier(rank_, limit);
        break;
      }
      case LocalReduction::Ring: {
        // Chunk c is [c*n/k, (c+1)*n/k). Reduce-scatter step s: replica r adds its chunk
        // (r-s) into replica r+1's; afterwards replica r owns the total of chunk r+1.
        // All-gather step s: replica r copies chunk (r+1-s) to replica r+1. In each step a
        // replica writes only the chunk its right neighbour neither reads nor writes.
        copyIn(rank_);
        g.barrier(rank_, limit);
        auto lo = [&](int c) { return static_cast<size_t>(c) * n / k; };
        auto hi = [&](int c) { return static_cast<size_t>(c + 1) * n / k; };
        const int right = (rank_ + 1) % k;
        for (int s = 0; s + 1 < k; ++s) {
          const int c = ((rank_ - s) % k + k) % k;
          comm::detail::reduceInto(recvOf(right) + lo(c) * esize, recvOf(rank_) + lo(c) * esize, hi(c) - lo(c),
                       round.dtype, round.op);
          g.barrier(rank_, limit);
        }
        if (round.op == comm::ReduceOp::Avg) {
          const int c = (rank_ + 1) % k;
          comm::detail::finishAvg(recvOf(rank_) + lo(c) * esize, hi(c) - lo(c), round.dtype, k);
          g.barrier(rank_, limit);
        }
        for (int s = 0; s + 1 < k; ++s) {
          const int c = ((rank_ + 1 - s) % k + k) % k;
          if (hi(c) > lo(c))
            std::memcpy(recvOf(right) + lo(c) * esize, recvOf(rank_) + lo(c) * esize,
                        (hi(c) - lo(c)) * esize);
          g.barrier(rank_, limit);
        }
        break;
      }
    }
  }

  std::shared_ptr<GroupState> group_;
  int rank_;
  std::chrono::milliseconds timeout_{0};
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;

  friend class ReplicaWork;
};

void ReplicaWork::wait(std::chrono::milliseconds timeout) { comm_->completeThrough(seq_, timeout); }
bool ReplicaWork::test() { return comm_->completed(seq_); }

}  // namespace

void abortReplicaGroup(comm::Communicator& member, const std::string& reason) {
  auto* replica = dynamic_cast<ReplicaCommunicator*>(&member);
  KOLO_CHECK(replica != nullptr, "abortReplicaGroup: communicator '", member.backendName(),
             "' is not a replica-group member");
  replica->abort(reason);
}

std::vector<std::shared_ptr<comm::Communicator>> makeReplicaGroup(
    int replicas, LocalReduction reduction, std::chrono::milliseconds timeout) {
  KOLO_CHECK_GT(replicas, 0, "(replica count)");
  auto group = std::make_shared<GroupState>();
  group->size = replicas;
  group->reduction = reduction;
  group->timeout = timeout;
  group->arrived.assign(replicas, false);
  std::vector<std::shared_ptr<comm::Communicator>> comms;
  for (int r = 0; r < replicas; ++r) {
    auto c = std::make_shared<ReplicaCommunicator>(group, r);
    c->setTimeout(timeout);
    comms.push_back(c);
  }
  return comms;
}

}  // namespace kolo::parallel
