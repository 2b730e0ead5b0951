// The native engine's waits and failures: spinning, yielding and sleeping on the right
// transport until an operation completes or its deadline passes, checking that the awaited
// peers still live, naming the ranks that left in a timeout, and telling the other peers
// (Abort frames) when this rank gives up on a collective (a loss, a deadline, a disagreement).
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <sstream>

#include "comm/native/engine.h"
#include "kolo/error.h"

namespace kolo::comm::native {
namespace {

// Waits poll the clock every this many spins; after the engine's spin time they yield
// this many times, then sleep.
constexpr int kSpinCheckEvery = 16;
constexpr int kYieldIterations = 200;
// A sched_yield() that keeps the CPU away longer than this ran another thread rather than
// finding nothing else to run (which returns in about a microsecond).
constexpr auto kYieldGaveAway = std::chrono::microseconds(50);
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
// How long a rank that gives up keeps sending its Abort frames before it throws.
constexpr auto kAbortFlush = std::chrono::milliseconds(200);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}

}  // namespace

void Engine::checkAlive(int peer, int groupPeer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.channel || !p.broken.empty() || p.channel->peerAlive()) return;
  progressPeer(peer);  // it may have written everything just before leaving
  if (p.broken.empty() && !p.channel->peerAlive())
    breakPeer(peer, "rank " + std::to_string(groupPeer) + " (" + p.channel->kind() + " peer) has exited", true);
}

void Engine::tellPeers(const Op& op) {
  if (!op.label.collective || !peers_[static_cast<size_t>(op.peer)].vanished) return;
  sendAborts();
}

void Engine::abort(const std::string& cause, GaveUp why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rootCause_.empty()) {
    rootCause_ = cause;
    rootWhy_ = why;
  }
  sendAborts();
}

void Engine::sendAborts() {
  if (told_) return;
  told_ = true;
  // Peers connecting to this rank are told too: they may be waiting on it.
  if (connector_) pumpConnector();
  std::vector<int> told = channelled_;
  if (connector_) {
    const std::vector<int> connecting = connector_->connectingPeers();
    told.insert(told.end(), connecting.begin(), connecting.end());
  }
  std::vector<std::shared_ptr<SendOp>> sent;
  for (int q : told) {
    Peer& p = peers_[static_cast<size_t>(q)];
    // A peer that is gone reads nothing: writing to it could only wait for ring space.
    if (q == rank_ || !p.broken.empty() || (p.channel && !p.channel->peerAlive())) continue;
    auto s = std::make_shared<SendOp>();
    s->peer = q;
    s->label = OpLabel{.name = "abort", .collective = false, .groupRank = rank_, .groupPeer = q};
    s->header.kind = static_cast<uint8_t>(FrameKind::Abort);
    s->header.tag = static_cast<int32_t>(rootWhy_);
    s->header.length = std::min<uint64_t>(rootCause_.size(), kMaxAbortBytes);
    s->data = reinterpret_cast<const uint8_t*>(rootCause_.data());
    s->bytes = static_cast<size_t>(s->header.length);
    p.sends.push_back(s);
    sent.push_back(s);
  }
  const Clock::time_point until = Clock::now() + kAbortFlush;
  const auto pending = [&] {
    return std::any_of(sent.begin(), sent.end(), [](const auto& s) { return !s->complete; });
  };
  while (pending() && Clock::now() < until) {
    if (connector_ && connector_->busy()) pumpConnector();
    for (const auto& s : sent)
      if (!s->complete) progressPeer(s->peer);
    if (pending()) sched_yield();
  }
}

std::string Engine::exitedPeers() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> gone;
  std::vector<int> channelled = channelled_;
  std::sort(channelled.begin(), channelled.end());
  for (int q : channelled) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (q == rank_) continue;
    if (p.vanished || (p.broken.empty() && !p.channel->peerAlive()))
      gone.push_back("rank " + std::to_string(q) + " (" + p.channel->kind() + " peer)");
  }
  if (gone.empty()) return "";
  std::string text = "; meanwhile ";
  for (size_t i = 0; i < gone.size(); ++i)
    text += (i == 0 ? "" : i + 1 == gone.size() ? " and " : ", ") + gone[i];
  return text + (gone.size() == 1 ? " has" : " have") + " exited (ranks of the whole job)";
}

void Engine::throwTimeout(const Op& op, std::chrono::milliseconds budget) {
  // A rank waiting on a live peer that waits on a dead one runs out of time naming the live
  // one: the ranks that left are named too, as the likely cause.
  const std::string exited = exitedPeers();
  std::string connecting;  // why there is no channel to the peer yet, when there is none
  if (op.peer >= 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (connector_ && connector_->connecting(op.peer)) connecting = " (" + connector_->describe(op.peer) + ")";
  }
  const bool isSend = dynamic_cast<const SendOp*>(&op) != nullptr;
  if (isSend) {
    KOLO_THROW(Timeout, op.label.prefix(), ": rank ", op.label.groupPeer, " did not take data after ",
               seconds(budget), connecting, exited);
  }
  if (op.peer < 0) KOLO_THROW(Timeout, op.label.prefix(), ": no data from any rank after ", seconds(budget), exited);
  KOLO_THROW(Timeout, op.label.prefix(), ": no data from rank ", op.label.groupPeer, " after ",
             seconds(budget), connecting, exited);
}

bool Engine::busy(const Peer& p) {
  return p.channel && p.broken.empty() &&
         (!p.sends.empty() || !p.recvs.empty() || p.inBody || p.headerHave > 0);
}

void Engine::sleepBriefly(long micros) {
  // Which transports have work in flight decides what to sleep on: a futex wait on the
  // doorbell cannot watch sockets and poll() cannot watch the doorbell. While no TCP
  // transfer is under way (e.g. a hierarchical all-reduce's phases inside the host) the
  // doorbell is the one to wait on, or every ring-full handoff costs a poll() timeout.
  bool tcpBusy = false, shmBusy = false;
  if (!tcpPeers_.empty() || connector_) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int peer : tcpPeers_) tcpBusy = tcpBusy || busy(peers_[static_cast<size_t>(peer)]);
    // A receive from any source may be answered over either transport; a connection under
    // way (an operation waits for it) is TCP work.
    const bool any = !anyRecvs_.empty();
    tcpBusy = tcpBusy || any || (connector_ && connector_->busy());
    shmBusy = any && bell_ != nullptr;
    if (tcpBusy && bell_ != nullptr) {
      for (size_t i = 0; i < channelled_.size() && !shmBusy; ++i) {
        const Peer& p = peers_[static_cast<size_t>(channelled_[i])];
        shmBusy = p.channel->pollFd() < 0 && busy(p);
      }
    }
  }
  // A nap on sockets: the TCP channels (and their room to write, with `writes`), the
  // listener and the handshakes; a connection or greeting that arrives is taken at once.
  const auto napOnSockets = [&](bool writes, long ms) {
    std::vector<pollfd> fds;
    size_t connectorFds = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int peer : tcpPeers_) {
        Peer& p = peers_[static_cast<size_t>(peer)];
        if (!p.broken.empty()) continue;
        short events = POLLIN;
        if (writes && !p.sends.empty()) events |= POLLOUT;
        fds.push_back({p.channel->pollFd(), events, 0});
      }
      connectorFds = fds.size();
      if (connector_) connector_->addPollFds(fds);
    }
    if (fds.empty()) {
      sched_yield();
      return;
    }
    if (poll(fds.data(), fds.size(), static_cast<int>(ms)) <= 0) return;
    for (size_t i = connectorFds; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      std::lock_guard<std::mutex> lock(mutex_);
      pumpConnector();
      return;
    }
  };
  if (tcpBusy) {
    // With shared-memory transfers in flight too, a doorbell could ring meanwhile: keep
    // the nap short.
    napOnSockets(true, shmBusy ? 1 : (micros + 999) / 1000);
    return;
  }
  if (bell_ == nullptr) {
    // Nothing in flight anywhere: a nap, woken early by any arrival.
    napOnSockets(false, (micros + 999) / 1000);
    return;
  }
  // The doorbell protocol is the store-buffer (Dekker) pattern between two processes:
  //   writer:  publish data (ring tail/head store); seq_cst fence F1; load `sleepers`
  //   sleeper: `sleepers` += 1 (seq_cst RMW U); seq_cst fence F2; load the rings
  // Suppose the writer saw `sleepers` == 0 and our re-check missed its data. Its load read
  // a value before U, so F1 precedes U in the single total order S ([atomics.order] p4.3);
  // our ring load read a value before its store, so F2 precedes F1 (p4.4); and U precedes
  // F2 (sequenced before). U < F2 < F1 < U is a cycle: impossible. So either the writer
  // sees us and bumps `bell` (then the futex wait below returns at once, since `bell` is no
  // longer `seen`, or is woken), or the re-check sees its data and we do not sleep. The
  // RMW alone is not enough: without F2 the ring loads, which are acquire loads, are not
  // ordered after it in S (on x86 the locked RMW happens to be a full barrier, elsewhere
  // not). `seen` is read after U: a bump that the writer made before we read `seen`
  // follows its data (release) and our seq_cst load of `bell` acquires it, so the
  // re-check sees that data too.
  bell_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint32_t seen = bell_->bell.load(std::memory_order_seq_cst);
  bool ready = false;
  {
    // Re-check after announcing ourselves. Any byte moved (a whole frame may arrive and
    // complete the op in this one pass, leaving no partial state behind) or a peer found
    // gone means there is something to look at: do not sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t movedBefore = bytesMoved_;
    for (size_t i = 0; i < channelled_.size() && !ready; ++i) {
      Peer& p = peers_[static_cast<size_t>(channelled_[i])];
      if (!busy(p)) continue;
      progressPeer(channelled_[i]);
      ready = bytesMoved_ != movedBefore || !p.broken.empty();
    }
  }
  if (!ready) sleepOnDoorbell(*bell_, seen, micros);
  bell_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

Engine::WaitCounts Engine::waitCounts() {
  WaitCounts counts{spun_.load(std::memory_order_relaxed), yielded_.load(std::memory_order_relaxed),
                    slept_.load(std::memory_order_relaxed), yieldCalls_.load(std::memory_order_relaxed), 0};
  std::lock_guard<std::mutex> lock(mutex_);
  for (int q : channelled_) counts.ringSetups += static_cast<uint64_t>(peers_[static_cast<size_t>(q)].channel->setups());
  counts.tcpChannels = tcpPeers_.size();
  return counts;
}

void Engine::wait(Op& op, Clock::time_point deadline, std::chrono::milliseconds budget) {
  int spins = 0;
  bool spinning = true;
  int yields = 0;
  bool slept = false;
  // Counts how the wait went, however it ends.
  struct Count {
    Engine& engine;
    const int& yields;
    const bool& slept;
    ~Count() {
      (slept ? engine.slept_ : yields > 0 ? engine.yielded_ : engine.spun_).fetch_add(1, std::memory_order_relaxed);
    }
  } count{*this, yields, slept};
  Clock::time_point start{};
  Clock::time_point lastLiveness{};
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!op.complete) progressAll();
      if (op.complete) {
        if (!op.error) return;
        tellPeers(op);
        std::rethrow_exception(op.error);
      }
    }
    if (spinning) {
      if (spins == 0) {
        start = Clock::now();
        lastLiveness = start;
        const int cpu = sched_getcpu();
        // Stored only when it changes: peers read this cache line on every doorbell ring.
        if (bell_ != nullptr && bell_->cpu.load(std::memory_order_relaxed) != cpu)
          bell_->cpu.store(cpu, std::memory_order_relaxed);
        std::lock_guard<std::mutex> lock(mutex_);
        const Channel* ch = op.peer >= 0 ? peers_[static_cast<size_t>(op.peer)].channel.get() : nullptr;
        if (cpu >= 0 && ch && ch->peerCpu() == cpu) spinning = false;  // it cannot run while we spin
      }
      ++spins;
      if (!spinning) continue;
      cpuRelax();
      if (spins % kSpinCheckEvery != 0 || Clock::now() - start < spinTime_) continue;
      spinning = false;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) throwTimeout(op, budget);
    if (now - lastLiveness >= kLivenessInterval) {
      lastLiveness = now;
      std::lock_guard<std::mutex> lock(mutex_);
      if (connector_) pumpConnector();
      if (op.peer >= 0) {
        checkAlive(op.peer, op.label.groupPeer);
      } else {  // a receive from any source: each rank it may come from
        const auto& r = static_cast<const RecvOp&>(op);
        for (size_t i = 0; i < r.from.size() && !op.complete; ++i) checkAlive(r.from[i], r.fromGroupRanks[i]);
      }
      if (op.complete && op.error) {
        tellPeers(op);
        std::rethrow_exception(op.error);
      }
    }
    if (yields < kYieldIterations) {
      ++yields;
      yieldCalls_.fetch_add(1, std::memory_order_relaxed);
      sched_yield();
      // A yield is for a peer on this CPU that is about to answer. One that kept the CPU
      // away this long ran other work (this process's computation or another's): if the op
      // is still not done when we are back (checked above), that work needs the CPU more
      // than this wait, which sleeps until its data arrives instead of taking a share of
      // the CPU yield after yield and noticing its data only a time slice late.
      if (Clock::now() - now >= kYieldGaveAway) yields = kYieldIterations;
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
    slept = true;
    sleepBriefly(left < 50000 ? static_cast<long>(left) + 1 : 50000);
  }
}

}  // namespace kolo::comm::native
