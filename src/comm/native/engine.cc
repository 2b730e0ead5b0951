// Progress engine of the native transports: framing, matching and deadline-bound waits.
#include "comm/native/engine.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

// Waits poll the clock every this many spins; after the engine's spin time they yield
// this many times, then sleep.
constexpr int kSpinCheckEvery = 16;
constexpr int kYieldIterations = 200;
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

bool sameKey(const FrameHeader& h, FrameKind kind, uint32_t context, int32_t tag) {
  if (h.kind != static_cast<uint8_t>(kind) || h.context != context) return false;
  return kind == FrameKind::Collective || h.tag == tag;
}

}  // namespace

std::string OpLabel::prefix() const {
  std::ostringstream out;
  if (collective) {
    out << name << " #" << seq << " on rank " << groupRank;
  } else {
    out << name << " (tag " << tag << ") on rank " << groupRank;
  }
  return out.str();
}

Engine::Engine(int rank, int size) : rank_(rank), size_(size), peers_(static_cast<size_t>(size)) {}

Engine::~Engine() = default;

void Engine::setChannel(int peer, std::unique_ptr<Channel> channel) {
  if (channel->pollFd() >= 0) tcpPeers_.push_back(peer);
  peers_[static_cast<size_t>(peer)].channel = std::move(channel);
}

bool Engine::hasChannel(int peer) const { return peers_[static_cast<size_t>(peer)].channel != nullptr; }

const char* Engine::channelKind(int peer) const {
  const auto& ch = peers_[static_cast<size_t>(peer)].channel;
  return ch ? ch->kind() : "none";
}

std::shared_ptr<SendOp> Engine::postSend(int peer, const FrameHeader& header, const void* data, size_t bytes,
                                         const OpLabel& label) {
  auto op = std::make_shared<SendOp>();
  op->peer = peer;
  op->label = label;
  op->header = header;
  op->header.length = bytes;
  op->data = static_cast<const uint8_t*>(data);
  op->bytes = bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.channel) KOLO_THROW(InvalidArgument, label.prefix(), ": no channel to rank ", label.groupPeer);
  if (!p.broken.empty()) {
    failOp(*op, brokenError(p, label));
    return op;
  }
  p.sends.push_back(op);
  if (p.sends.size() == 1) progressPeer(peer);  // fast path: write now
  return op;
}

std::shared_ptr<RecvOp> Engine::postRecv(int peer, FrameKind kind, uint32_t context, int32_t tag, uint64_t seq,
                                         const Signature& expected, void* data, size_t bytes,
                                         const OpLabel& label) {
  auto op = std::make_shared<RecvOp>();
  op->peer = peer;
  op->label = label;
  op->kind = kind;
  op->context = context;
  op->tag = tag;
  op->seq = seq;
  op->expected = expected;
  op->data = static_cast<uint8_t*>(data);
  op->bytes = bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.channel) KOLO_THROW(InvalidArgument, label.prefix(), ": no channel to rank ", label.groupPeer);
  p.recvs.push_back(op);
  if (!p.unexpected.empty()) matchUnexpected(peer);
  // A peer that has left may still have sent what we ask for (it arrived before its
  // connection closed and waits among the early arrivals); only otherwise is it an error.
  if (!op->complete && !p.broken.empty()) {
    p.recvs.pop_back();
    failOp(*op, brokenError(p, label));
  }
  return op;
}

std::shared_ptr<RecvOp> Engine::postRecvAny(std::vector<int> from, std::vector<int> fromGroupRanks,
                                            uint32_t context, int32_t tag, const Signature& expected, void* data,
                                            size_t bytes, const OpLabel& label) {
  KOLO_CHECK(!from.empty() && from.size() == fromGroupRanks.size(), "(receive from any source: no ranks)");
  auto op = std::make_shared<RecvOp>();
  op->peer = -1;
  op->label = label;
  op->from = std::move(from);
  op->fromGroupRanks = std::move(fromGroupRanks);
  op->kind = FrameKind::PointToPoint;
  op->context = context;
  op->tag = tag;
  op->expected = expected;
  op->data = static_cast<uint8_t*>(data);
  op->bytes = bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int q : op->from)
    if (!peers_[static_cast<size_t>(q)].channel)
      KOLO_THROW(InvalidArgument, label.prefix(), ": no channel to engine rank ", q);
  anyRecvs_.push_back(op);
  // An early arrival from any of them (whole; the lowest rank's first) is taken now.
  for (int q : op->from) {
    matchUnexpected(q);
    if (op->complete) break;
  }
  failOrphanedAnyRecvs();
  return op;
}

std::shared_ptr<RecvOp> Engine::claimAnyRecv(int peer, const FrameHeader& h) {
  for (auto it = anyRecvs_.begin(); it != anyRecvs_.end(); ++it) {
    RecvOp& op = **it;
    if (!sameKey(h, op.kind, op.context, op.tag)) continue;
    const auto at = std::find(op.from.begin(), op.from.end(), peer);
    if (at == op.from.end()) continue;
    std::shared_ptr<RecvOp> claimed = *it;
    anyRecvs_.erase(it);
    claimed->peer = peer;
    claimed->label.groupPeer = claimed->fromGroupRanks[static_cast<size_t>(at - claimed->from.begin())];
    return claimed;
  }
  return nullptr;
}

void Engine::failOrphanedAnyRecvs() {
  for (auto it = anyRecvs_.begin(); it != anyRecvs_.end();) {
    RecvOp& op = **it;
    const bool orphaned = std::all_of(op.from.begin(), op.from.end(), [&](int q) {
      return !peers_[static_cast<size_t>(q)].broken.empty();
    });
    if (!orphaned) {
      ++it;
      continue;
    }
    failOp(op, std::make_exception_ptr(PeerError(
                   op.label.prefix() + ": every rank it could receive from has left (" +
                   peers_[static_cast<size_t>(op.from.back())].broken + ")")));
    it = anyRecvs_.erase(it);
  }
}

void Engine::checkAlive(int peer, int groupPeer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.channel || !p.broken.empty() || p.channel->peerAlive()) return;
  progressPeer(peer);  // it may have written everything just before leaving
  if (p.broken.empty() && !p.channel->peerAlive())
    breakPeer(peer, "rank " + std::to_string(groupPeer) + " (" + p.channel->kind() + " peer) has exited", true);
}

void Engine::failOp(Op& op, std::exception_ptr error) {
  op.error = std::move(error);
  op.complete = true;
}

std::exception_ptr Engine::brokenError(const Peer& p, const OpLabel& label) {
  const std::string message = label.prefix() + ": " + p.broken;
  if (p.vanished) return std::make_exception_ptr(PeerError(message));
  return std::make_exception_ptr(IoError(message));
}

void Engine::breakPeer(int peer, const std::string& why, bool vanished) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.broken.empty()) {
    p.broken = why;
    p.vanished = vanished;
    if (vanished && rootCause_.empty()) rootCause_ = why;
  }
  matchUnexpected(peer);  // what arrived complete before the break is still delivered
  for (auto& s : p.sends) failOp(*s, brokenError(p, s->label));
  p.sends.clear();
  for (auto& r : p.recvs) failOp(*r, brokenError(p, r->label));
  p.recvs.clear();
  if (p.inRecv) failOp(*p.inRecv, brokenError(p, p.inRecv->label));
  p.inRecv.reset();
  failOrphanedAnyRecvs();
}

std::exception_ptr Engine::checkFrame(const RecvOp& op, const FrameHeader& h) const {
  const Signature got = h.signature();
  if (op.kind == FrameKind::Collective) {
    if (h.seq != op.seq || !(got == op.expected)) {
      std::ostringstream out;
      out << op.label.prefix() << " (" << describeSignature(op.expected) << ") vs rank " << op.label.groupPeer
          << " (";
      if (h.seq != op.seq || got.collective != op.expected.collective)
        out << collectiveName(got.collective) << " #" << h.seq << " ";
      out << describeSignature(got) << ")";
      return std::make_exception_ptr(Mismatch(out.str()));
    }
  } else if (got.dtype != op.expected.dtype || h.length != op.bytes) {
    std::ostringstream out;
    out << op.label.prefix() << " expects " << op.bytes / dtypeSize(op.expected.dtype) << " x "
        << dtypeName(op.expected.dtype) << " but rank " << op.label.groupPeer << " sent "
        << h.count << " x " << dtypeName(got.dtype);
    return std::make_exception_ptr(Mismatch(out.str()));
  }
  if (h.length != op.bytes) {
    std::ostringstream out;
    out << op.label.prefix() << " (" << describeSignature(op.expected) << "): rank " << op.label.groupPeer
        << " sent a message of " << h.length << " bytes where " << op.bytes << " were expected";
    return std::make_exception_ptr(Mismatch(out.str()));
  }
  return nullptr;
}

void Engine::matchUnexpected(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  for (auto it = p.recvs.begin(); it != p.recvs.end();) {
    RecvOp& op = **it;
    std::shared_ptr<Unexpected> found;
    auto uit = p.unexpected.begin();
    for (; uit != p.unexpected.end(); ++uit) {
      if (sameKey((*uit)->header, op.kind, op.context, op.tag)) {
        found = *uit;
        break;
      }
    }
    if (!found || !found->complete) {
      ++it;
      continue;
    }
    if (auto err = checkFrame(op, found->header)) {
      failOp(op, err);
    } else {
      if (op.bytes > 0) std::memcpy(op.data, found->payload.data(), op.bytes);
      op.complete = true;
    }
    p.unexpected.erase(uit);
    it = p.recvs.erase(it);
  }
  // What no named receive took goes to the receives from any source, in arrival order (only
  // the last frame can still be arriving).
  for (auto uit = p.unexpected.begin(); uit != p.unexpected.end() && (*uit)->complete && !anyRecvs_.empty();) {
    const Unexpected& u = **uit;
    std::shared_ptr<RecvOp> op =
        u.header.kind == static_cast<uint8_t>(FrameKind::PointToPoint) ? claimAnyRecv(peer, u.header) : nullptr;
    if (!op) {
      ++uit;
      continue;
    }
    if (auto err = checkFrame(*op, u.header)) {
      failOp(*op, err);
    } else {
      if (op->bytes > 0) std::memcpy(op->data, u.payload.data(), op->bytes);
      op->complete = true;
    }
    uit = p.unexpected.erase(uit);
  }
}

void Engine::onHeader(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  const FrameHeader& h = p.inHeader;
  try {
    checkFrameHeader(h);
  } catch (const FormatError& e) {
    breakPeer(peer, "corrupt frame from rank " + std::to_string(peer) + " (" + e.what() + ")");
    return;
  }
  p.inBody = true;
  p.bodyLeft = h.length;
  const FrameKind kind = static_cast<FrameKind>(h.kind);
  bool queued = false;
  for (auto& u : p.unexpected)
    if (sameKey(u->header, kind, h.context, h.tag)) queued = true;
  if (!queued) {
    for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it) {
      if (!sameKey(h, (*it)->kind, (*it)->context, (*it)->tag)) continue;
      std::shared_ptr<RecvOp> op = *it;
      p.recvs.erase(it);
      if (auto err = checkFrame(*op, h)) {
        failOp(*op, err);  // the payload is read and dropped below
      } else {
        p.inRecv = op;
      }
      return;
    }
    if (kind == FrameKind::PointToPoint) {
      if (std::shared_ptr<RecvOp> op = claimAnyRecv(peer, h)) {
        if (auto err = checkFrame(*op, h)) {
          failOp(*op, err);
        } else {
          p.inRecv = op;
        }
        return;
      }
    }
  }
  if (h.length > kMaxUnexpectedBytes) {
    breakPeer(peer, "frame of " + std::to_string(h.length) + " bytes from rank " + std::to_string(peer) +
                        " exceeds the limit for unrequested messages");
    return;
  }
  auto u = std::make_shared<Unexpected>();
  u->header = h;
  u->payload.resize(h.length);
  p.unexpected.push_back(u);
  p.inUnexpected = u;
}

void Engine::finishBody(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.inBody = false;
  p.headerHave = 0;
  if (p.inRecv) {
    p.inRecv->complete = true;
    p.inRecv.reset();
  }
  if (p.inUnexpected) {
    std::shared_ptr<Unexpected> u = std::move(p.inUnexpected);
    u->complete = true;
    if (u->header.kind == static_cast<uint8_t>(FrameKind::Abort)) {
      p.unexpected.erase(std::find(p.unexpected.begin(), p.unexpected.end(), u));
      onAbort(peer, *u);
      return;
    }
    matchUnexpected(peer);
  }
}

void Engine::onAbort(int peer, const Unexpected& u) {
  const std::string cause(u.payload.begin(), u.payload.end());
  if (rootCause_.empty()) rootCause_ = cause;
  breakPeer(peer, "rank " + std::to_string(peer) + " gave up: " + cause, true);
}

void Engine::tellPeers(const Op& op) {
  if (told_ || !op.label.collective || !peers_[static_cast<size_t>(op.peer)].vanished) return;
  told_ = true;
  std::vector<std::shared_ptr<SendOp>> sent;
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (q == rank_ || !p.channel || !p.broken.empty()) continue;
    auto s = std::make_shared<SendOp>();
    s->peer = q;
    s->label = OpLabel{.name = "abort", .collective = false, .groupRank = rank_, .groupPeer = q};
    s->header.kind = static_cast<uint8_t>(FrameKind::Abort);
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
    for (const auto& s : sent)
      if (!s->complete) progressPeer(s->peer);
    if (pending()) sched_yield();
  }
}

void Engine::readFrames(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  Channel& ch = *p.channel;
  uint8_t sink[4096];
  for (;;) {
    if (!p.inBody) {
      auto* hb = reinterpret_cast<uint8_t*>(&p.inHeader);
      const size_t got = ch.readSome(hb + p.headerHave, sizeof(FrameHeader) - p.headerHave);
      p.headerHave += got;
      bytesMoved_ += got;
      if (p.headerHave < sizeof(FrameHeader)) return;
      onHeader(peer);
      if (!p.broken.empty()) return;
      if (p.bodyLeft == 0) {
        finishBody(peer);
        if (!p.broken.empty()) return;
        continue;
      }
    }
    size_t n;
    if (p.inRecv) {
      RecvOp& op = *p.inRecv;
      const size_t off = op.bytes - static_cast<size_t>(p.bodyLeft);
      n = ch.readSome(op.data + off, static_cast<size_t>(p.bodyLeft));
    } else if (p.inUnexpected) {
      Unexpected& u = *p.inUnexpected;
      const size_t off = u.payload.size() - static_cast<size_t>(p.bodyLeft);
      n = ch.readSome(u.payload.data() + off, static_cast<size_t>(p.bodyLeft));
    } else {
      n = ch.readSome(sink, p.bodyLeft < sizeof(sink) ? static_cast<size_t>(p.bodyLeft) : sizeof(sink));
    }
    p.bodyLeft -= n;
    bytesMoved_ += n;
    if (p.bodyLeft != 0) return;
    finishBody(peer);
    if (!p.broken.empty()) return;
  }
}

void Engine::progressPeer(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.channel || !p.broken.empty()) return;
  try {
    Channel& ch = *p.channel;
    while (!p.sends.empty()) {
      SendOp& s = *p.sends.front();
      constexpr size_t kHeader = sizeof(FrameHeader);
      size_t n = 0;
      if (s.sent < kHeader) {
        n = ch.writeSome2(reinterpret_cast<const uint8_t*>(&s.header) + s.sent, kHeader - s.sent, s.data, s.bytes);
      } else if (s.sent < kHeader + s.bytes) {
        n = ch.writeSome(s.data + (s.sent - kHeader), kHeader + s.bytes - s.sent);
      }
      s.sent += n;
      bytesMoved_ += n;
      if (s.sent < kHeader + s.bytes) break;
      s.complete = true;
      p.sends.pop_front();
    }
    readFrames(peer);
    ch.readsDone();
  } catch (const PeerError& e) {
    breakPeer(peer, std::string("rank ") + std::to_string(peer) + " is gone: " + e.what(), true);
  } catch (const IoError& e) {
    breakPeer(peer, std::string("rank ") + std::to_string(peer) + " is gone: " + e.what());
  }
}

void Engine::progressAll() {
  for (int i = 0; i < size_; ++i) progressPeer(i);
}

bool Engine::test(Op& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!op.complete) progressAll();
  return op.complete;
}

void Engine::cancel(const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (op->complete) return;
  if (op->peer < 0) {  // a receive from any source, not matched yet
    anyRecvs_.erase(std::remove(anyRecvs_.begin(), anyRecvs_.end(), op), anyRecvs_.end());
    failOp(*op, std::make_exception_ptr(Error(op->label.prefix() + ": cancelled")));
    return;
  }
  Peer& p = peers_[static_cast<size_t>(op->peer)];
  for (auto it = p.sends.begin(); it != p.sends.end(); ++it) {
    if (it->get() != op.get()) continue;
    if ((*it)->sent > 0) {
      breakPeer(op->peer, "an earlier operation to rank " + std::to_string(op->peer) + " was abandoned mid-message");
    } else {
      p.sends.erase(it);
    }
    break;
  }
  for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it) {
    if (it->get() == op.get()) {
      p.recvs.erase(it);
      break;
    }
  }
  if (p.inRecv.get() == op.get()) p.inRecv.reset();  // the rest of its payload is dropped
  failOp(*op, std::make_exception_ptr(Error(op->label.prefix() + ": cancelled")));
}

std::string Engine::exitedPeers() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> gone;
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (q == rank_ || !p.channel) continue;
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
  const bool isSend = dynamic_cast<const SendOp*>(&op) != nullptr;
  if (isSend) {
    KOLO_THROW(Timeout, op.label.prefix(), ": rank ", op.label.groupPeer, " did not take data after ",
               seconds(budget), exited);
  }
  if (op.peer < 0) KOLO_THROW(Timeout, op.label.prefix(), ": no data from any rank after ", seconds(budget), exited);
  KOLO_THROW(Timeout, op.label.prefix(), ": no data from rank ", op.label.groupPeer, " after ",
             seconds(budget), exited);
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
  if (!tcpPeers_.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int peer : tcpPeers_) tcpBusy = tcpBusy || busy(peers_[static_cast<size_t>(peer)]);
    // A receive from any source may be answered over either transport.
    const bool any = !anyRecvs_.empty();
    tcpBusy = tcpBusy || any;
    shmBusy = any && bell_ != nullptr;
    if (tcpBusy && bell_ != nullptr) {
      for (int i = 0; i < size_ && !shmBusy; ++i) {
        const Peer& p = peers_[static_cast<size_t>(i)];
        shmBusy = p.channel && p.channel->pollFd() < 0 && busy(p);
      }
    }
  }
  if (tcpBusy) {
    std::vector<pollfd> fds;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int peer : tcpPeers_) {
        Peer& p = peers_[static_cast<size_t>(peer)];
        if (!p.broken.empty()) continue;
        short events = POLLIN;
        if (!p.sends.empty()) events |= POLLOUT;
        fds.push_back({p.channel->pollFd(), events, 0});
      }
    }
    // With shared-memory transfers in flight too, a doorbell could ring meanwhile: keep
    // the nap short.
    const long ms = shmBusy ? 1 : (micros + 999) / 1000;
    poll(fds.data(), fds.size(), static_cast<int>(ms));
    return;
  }
  if (bell_ == nullptr) {
    if (!tcpPeers_.empty()) {
      // Nothing in flight anywhere: a nap, woken early by any arrival.
      std::vector<pollfd> fds;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (int peer : tcpPeers_) {
          Peer& p = peers_[static_cast<size_t>(peer)];
          if (p.broken.empty()) fds.push_back({p.channel->pollFd(), POLLIN, 0});
        }
      }
      poll(fds.data(), fds.size(), static_cast<int>((micros + 999) / 1000));
      return;
    }
    sched_yield();
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
    for (int i = 0; i < size_ && !ready; ++i) {
      Peer& p = peers_[static_cast<size_t>(i)];
      if (!busy(p)) continue;
      progressPeer(i);
      ready = bytesMoved_ != movedBefore || !p.broken.empty();
    }
  }
  if (!ready) sleepOnDoorbell(*bell_, seen, micros);
  bell_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void Engine::wait(Op& op, Clock::time_point deadline, std::chrono::milliseconds budget) {
  int spins = 0;
  bool spinning = true;
  int yields = 0;
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
    if (yields++ < kYieldIterations) {
      sched_yield();
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
    sleepBriefly(left < 50000 ? static_cast<long>(left) + 1 : 50000);
  }
}

}  // namespace kolo::comm::native
