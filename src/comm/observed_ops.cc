// The flight-recorder entries and timeline spans of blocking and non-blocking operations,
// the Work wrapper that finishes a non-blocking one when its completion is seen, and the
// time each thread spends blocked in them (comm::blockedSeconds).
#include "comm/observed_ops.h"

#include <cstdio>
#include <string>
#include <utility>

#include "comm/blocked_time.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

void dumpFlightRecorder(uint64_t flightId, const char* error, const char* reason) {
  flight::failed(flightId, error);
  const std::string path = flight::dump(reason);
  if (!path.empty()) std::fprintf(stderr, "kolo: %s: flight recorder written to %s\n", reason, path.c_str());
}

void recordFailure(uint64_t flightId, const std::exception& error) {
  if (dynamic_cast<const Timeout*>(&error) != nullptr) {
    dumpFlightRecorder(flightId, error.what(), "timeout");
  } else if (dynamic_cast<const Mismatch*>(&error) != nullptr) {
    dumpFlightRecorder(flightId, error.what(), "mismatch");
  } else {
    flight::failed(flightId, error.what());
  }
}

flight::Description pointToPoint(const char* op, int rank, int size, uint32_t context, size_t count, DType dtype,
                                 int peer) {
  flight::Description d;
  d.context = context;
  d.groupRank = rank;
  d.groupSize = size;
  d.op = op;
  d.dtype = dtypeName(dtype);
  d.count = static_cast<int64_t>(count);
  d.bytes = static_cast<int64_t>(count * dtypeSize(dtype));
  d.peer = peer;
  return d;
}

PendingOp::PendingOp(const flight::Description& d)
    : PendingOp(d, flight::enabled() ? flight::begin(d, true) : 0, trace::nowNs()) {}

PendingOp::PendingOp(const flight::Description& d, uint64_t flightId, int64_t beginNs)
    : flightId_(flightId), open_(true) {
  if (trace::enabled()) {
    span_.name = d.op;
    span_.category = "comm";
    span_.begin = beginNs;
    span_.bytes = d.bytes;
    span_.seq = d.seq;
    span_.peer = d.peer;
    if (d.algorithm != nullptr && *d.algorithm != '\0') span_.detail = d.algorithm;
    span_.asyncId = trace::nextAsyncId();
  }
}

PendingOp::PendingOp(PendingOp&& other) noexcept
    : flightId_(other.flightId_), span_(other.span_), open_(std::exchange(other.open_, false)) {}

PendingOp& PendingOp::operator=(PendingOp&& other) noexcept {
  flightId_ = other.flightId_;
  span_ = other.span_;
  open_ = std::exchange(other.open_, false);
  return *this;
}

void PendingOp::closeSpan() {
  if (span_.asyncId < 0) return;
  span_.end = trace::nowNs();
  trace::record(span_);
  span_.asyncId = -1;
}

void PendingOp::done() {
  if (!open_) return;
  open_ = false;
  flight::finished(flightId_);
  closeSpan();
}

void PendingOp::fail(const std::exception& error, bool final) {
  if (!open_) return;
  recordFailure(flightId_, error);
  if (!final) return;
  open_ = false;
  closeSpan();
}

namespace {

class ObservedWork final : public Work {
 public:
  ObservedWork(std::unique_ptr<Work> inner, PendingOp op) : inner_(std::move(inner)), op_(std::move(op)) {}
  ~ObservedWork() override {
    // Dropped unwaited: record the completion if it happened (never block here).
    try {
      if (op_.open() && inner_->test()) settle();
    } catch (...) {
    }
  }
  void wait(std::chrono::milliseconds timeout) override {
    const BlockedTime blocked;
    try {
      inner_->wait(timeout);
    } catch (const Timeout& e) {
      op_.fail(e, false);  // still pending: a later wait may succeed
      throw;
    } catch (const std::exception& e) {
      op_.fail(e, true);
      throw;
    }
    op_.done();
  }
  bool test() override {
    if (!inner_->test()) return false;
    if (op_.open()) settle();
    return true;
  }
  int source() const override { return inner_->source(); }

 private:
  // Complete: a wait returns at once, with the operation's error if it failed.
  void settle() {
    try {
      inner_->wait(std::chrono::milliseconds(1));
      op_.done();
    } catch (const std::exception& e) {
      op_.fail(e, true);
    }
  }

  std::unique_ptr<Work> inner_;
  PendingOp op_;
};

}  // namespace

std::unique_ptr<Work> observeWork(std::unique_ptr<Work> inner, PendingOp op) {
  return std::make_unique<ObservedWork>(std::move(inner), std::move(op));
}

namespace {

thread_local double tBlockedSeconds = 0.0;
thread_local int tBlockedDepth = 0;

}  // namespace

BlockedTime::BlockedTime() {
  if (tBlockedDepth++ == 0) start_ = std::chrono::steady_clock::now();
}

BlockedTime::~BlockedTime() {
  if (--tBlockedDepth == 0)
    tBlockedSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double blockedSecondsOfThisThread() { return tBlockedSeconds; }

}  // namespace kolo::comm::detail

namespace kolo::comm {

double blockedSeconds() { return detail::blockedSecondsOfThisThread(); }

}  // namespace kolo::comm
