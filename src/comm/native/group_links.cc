// GroupLinks and EngineWork: stamping, deadlines and handles over the progress engine.
#include "comm/native/group_links.h"

#include "kolo/error.h"

namespace kolo::comm::native {

EngineWork::EngineWork(std::shared_ptr<Engine> engine, std::shared_ptr<Op> op, Clock::time_point deadline,
                       std::chrono::milliseconds budget)
    : engine_(std::move(engine)), op_(std::move(op)), deadline_(deadline), budget_(budget) {}

EngineWork::~EngineWork() {
  if (!done_ && !engine_->test(*op_)) engine_->cancel(op_);
}

void EngineWork::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) {
    engine_->wait(*op_, Clock::now() + timeout, timeout);
  } else {
    engine_->wait(*op_, deadline_, budget_);
  }
  done_ = true;
}

bool EngineWork::test() {
  if (!engine_->test(*op_)) return false;
  done_ = true;
  return true;
}

int EngineWork::source() const {
  const auto* recv = dynamic_cast<const RecvOp*>(op_.get());
  if (recv == nullptr || !done_ || recv->error) return -1;
  return recv->label.groupPeer;
}

GroupLinks::GroupLinks(std::shared_ptr<Engine> engine, std::vector<int> members, int groupRank, uint32_t context,
                       std::vector<bool> sameHost)
    : engine_(std::move(engine)),
      members_(std::move(members)),
      groupRank_(groupRank),
      context_(context),
      sameHost_(std::move(sameHost)) {}

void GroupLinks::begin(const Signature& sig, uint64_t seq, std::chrono::milliseconds budget) {
  sig_ = sig;
  seq_ = seq;
  budget_ = budget;
  deadline_ = Clock::now() + budget;
}

void GroupLinks::checkPeer(int peer) const {
  if (peer < 0 || peer >= size() || peer == groupRank_)
    KOLO_THROW(InvalidArgument, collectiveName(sig_.collective), " #", seq_, " on rank ", groupRank_,
               ": bad peer ", peer, " (group of ", size(), ")");
}

OpLabel GroupLinks::label(int peer) const {
  OpLabel l;
  l.name = collectiveName(sig_.collective);
  l.seq = seq_;
  l.collective = true;
  l.groupRank = groupRank_;
  l.groupPeer = peer;
  return l;
}

std::unique_ptr<Work> GroupLinks::isend(int peer, const void* data, size_t bytes) {
  checkPeer(peer);
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::Collective);
  h.context = context_;
  h.seq = seq_;
  h.setSignature(sig_);
  auto op = engine_->postSend(engineRank(peer), h, data, bytes, label(peer));
  return std::make_unique<EngineWork>(engine_, std::move(op), deadline_, budget_);
}

std::unique_ptr<Work> GroupLinks::irecv(int peer, void* data, size_t bytes) {
  checkPeer(peer);
  auto op = engine_->postRecv(engineRank(peer), FrameKind::Collective, context_, 0, seq_, sig_, data, bytes,
                              label(peer));
  return std::make_unique<EngineWork>(engine_, std::move(op), deadline_, budget_);
}

void GroupLinks::send(int peer, const void* data, size_t bytes) { isend(peer, data, bytes)->wait(); }

void GroupLinks::recv(int peer, void* data, size_t bytes) { irecv(peer, data, bytes)->wait(); }

std::unique_ptr<Work> GroupLinks::sendTagged(int peer, int tag, const void* data, size_t count, DType dtype,
                                             std::chrono::milliseconds budget, const char* what) {
  if (peer < 0 || peer >= size())
    KOLO_THROW(InvalidArgument, what, " on rank ", groupRank_, ": bad peer ", peer, " (group of ", size(), ")");
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::PointToPoint);
  h.context = context_;
  h.tag = tag;
  h.dtype = static_cast<uint8_t>(dtype);
  h.count = count;
  OpLabel l{what, 0, false, groupRank_, peer, tag};
  auto op = engine_->postSend(engineRank(peer), h, data, count * dtypeSize(dtype), l);
  return std::make_unique<EngineWork>(engine_, std::move(op), Clock::now() + budget, budget);
}

std::unique_ptr<Work> GroupLinks::recvTagged(int peer, int tag, void* data, size_t count, DType dtype,
                                             std::chrono::milliseconds budget, const char* what) {
  if (peer < 0 || peer >= size())
    KOLO_THROW(InvalidArgument, what, " on rank ", groupRank_, ": bad peer ", peer, " (group of ", size(), ")");
  Signature expected;
  expected.dtype = dtype;
  expected.count = count;
  OpLabel l{what, 0, false, groupRank_, peer, tag};
  auto op = engine_->postRecv(engineRank(peer), FrameKind::PointToPoint, context_, tag, 0, expected, data,
                              count * dtypeSize(dtype), l);
  return std::make_unique<EngineWork>(engine_, std::move(op), Clock::now() + budget, budget);
}

std::unique_ptr<Work> GroupLinks::recvTaggedAny(int tag, void* data, size_t count, DType dtype,
                                                std::chrono::milliseconds budget, const char* what) {
  if (size() < 2)
    KOLO_THROW(InvalidArgument, what, " from any rank on rank ", groupRank_, ": the group has no other rank");
  std::vector<int> from, fromGroupRanks;
  for (int r = 0; r < size(); ++r) {
    if (r == groupRank_) continue;
    from.push_back(engineRank(r));
    fromGroupRanks.push_back(r);
  }
  Signature expected;
  expected.dtype = dtype;
  expected.count = count;
  OpLabel l{what, 0, false, groupRank_, -1, tag};
  auto op = engine_->postRecvAny(std::move(from), std::move(fromGroupRanks), context_, tag, expected, data,
                                 count * dtypeSize(dtype), l);
  return std::make_unique<EngineWork>(engine_, std::move(op), Clock::now() + budget, budget);
}

}  // namespace kolo::comm::native
