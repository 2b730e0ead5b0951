// Progress engine of the native transports: posting sends and receives (from a peer or from
// any of several), reading and matching frames, broken peers. Waits, liveness and the Abort
// frames of a failed collective are in engine_wait.cc.
#include "comm/native/engine.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

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
  std::lock_guard<std::mutex> lock(mutex_);
  installChannel(peer, std::move(channel));
}

void Engine::installChannel(int peer, std::unique_ptr<Channel> channel) {
  if (channel->pollFd() >= 0) tcpPeers_.push_back(peer);
  channelled_.push_back(peer);
  peers_[static_cast<size_t>(peer)].channel = std::move(channel);
}

void Engine::setConnector(std::unique_ptr<Connector> connector) {
  std::lock_guard<std::mutex> lock(mutex_);
  connector_ = std::move(connector);
}

void Engine::needChannel(int peer, const OpLabel& label) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.channel || !p.broken.empty()) return;
  if (!connector_ || !connector_->reaches(peer))
    KOLO_THROW(InvalidArgument, label.prefix(), ": no channel to rank ", label.groupPeer);
  connector_->want(peer);
}

void Engine::pumpConnector() {
  idlePasses_ = 0;
  for (Connector::Outcome& o : connector_->progress()) {
    if (o.channel) {
      installChannel(o.peer, std::move(o.channel));
    } else {
      breakPeer(o.peer, "rank " + std::to_string(o.peer) + (o.vanished ? " is gone: " : ": cannot connect: ") + o.failure,
                o.vanished);
    }
  }
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
  needChannel(peer, label);
  if (!p.broken.empty()) {
    failOp(*op, brokenError(p, label));
    return op;
  }
  p.sends.push_back(op);
  if (p.sends.size() == 1) progressPeer(peer);  // fast path: write now
  return op;
}

namespace {

std::shared_ptr<RecvOp> makeRecv(int peer, FrameKind kind, uint32_t context, int32_t tag, uint64_t seq,
                                 const Signature& expected, void* data, size_t bytes, const OpLabel& label) {
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
  return op;
}

}  // namespace

std::shared_ptr<RecvOp> Engine::postRecv(int peer, FrameKind kind, uint32_t context, int32_t tag, uint64_t seq,
                                         const Signature& expected, void* data, size_t bytes,
                                         const OpLabel& label) {
  auto op = makeRecv(peer, kind, context, tag, seq, expected, data, bytes, label);
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[static_cast<size_t>(peer)];
  needChannel(peer, label);
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
  auto op = makeRecv(-1, FrameKind::PointToPoint, context, tag, 0, expected, data, bytes, label);
  op->from = std::move(from);
  op->fromGroupRanks = std::move(fromGroupRanks);
  std::lock_guard<std::mutex> lock(mutex_);
  // Each rank it may come from is connected to: a sender connects to this rank anyway, and
  // a channel is how this rank sees one leave.
  for (int q : op->from) {
    OpLabel named = label;
    named.groupPeer = q;
    needChannel(q, named);
  }
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

void Engine::failOp(Op& op, std::exception_ptr error) {
  op.error = std::move(error);
  op.complete = true;
}

std::exception_ptr Engine::brokenError(const Peer& p, const OpLabel& label) {
  const std::string message = label.prefix() + ": " + p.broken;
  if (p.vanished && p.why == GaveUp::TimedOut) return std::make_exception_ptr(Timeout(message));
  if (p.vanished && p.why == GaveUp::Disagreed) return std::make_exception_ptr(Mismatch(message));
  if (p.vanished) return std::make_exception_ptr(PeerError(message));
  return std::make_exception_ptr(IoError(message));
}

void Engine::breakPeer(int peer, const std::string& why, bool vanished, GaveUp gaveUp) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.broken.empty()) {
    p.broken = why;
    p.vanished = vanished;
    p.why = gaveUp;
    if (vanished && rootCause_.empty()) {
      rootCause_ = why;
      rootWhy_ = gaveUp;
    }
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
  // A tag this build does not know is taken for a lost peer, the kind an elastic job mends.
  const int32_t tag = u.header.tag;
  const GaveUp why = tag == static_cast<int32_t>(GaveUp::TimedOut)    ? GaveUp::TimedOut
                     : tag == static_cast<int32_t>(GaveUp::Disagreed) ? GaveUp::Disagreed
                                                                      : GaveUp::PeerLost;
  if (rootCause_.empty()) {
    rootCause_ = cause;
    rootWhy_ = why;
  }
  breakPeer(peer, "rank " + std::to_string(peer) + " gave up: " + cause, true, why);
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
    lostPeer(peer, e.what(), true);
  } catch (const IoError& e) {
    lostPeer(peer, e.what(), false);
  }
}

void Engine::lostPeer(int peer, const std::string& what, bool vanished) {
  // A peer that gave up wrote its Abort, the reason, before it closed its communicator: a
  // write that finds it closed reads what it left first, so that the reason and not its
  // absence is what this rank's operations report.
  Peer& p = peers_[static_cast<size_t>(peer)];
  try {
    readFrames(peer);
  } catch (const PeerError&) {
  } catch (const IoError&) {
  }
  if (p.broken.empty()) breakPeer(peer, "rank " + std::to_string(peer) + " is gone: " + what, vanished);
}

void Engine::progressAll() {
  // The listener is looked at on every pass while connections are under way, else now and
  // then (a syscall per pass would slow the spinning waits of shared memory).
  constexpr unsigned kIdleListenEvery = 256;
  if (connector_ && (connector_->busy() || ++idlePasses_ >= kIdleListenEvery)) pumpConnector();
  for (size_t i = 0; i < channelled_.size(); ++i) progressPeer(channelled_[i]);
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

}  // namespace kolo::comm::native
