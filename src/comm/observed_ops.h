// How the comm layer's operations enter the flight recorder (kolo/flight_recorder.h) and the
// timeline (kolo/trace.h), shared by the native and the MPI backends. A blocking operation is
// one entry started at once and a span on the calling thread; a non-blocking one is an entry
// started when it is issued and finished by whichever call sees it complete (wait or test),
// drawn in the timeline as an asynchronous span from issue to completion.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>

#include "comm/blocked_time.h"
#include "kolo/comm/communicator.h"
#include "kolo/flight_recorder.h"
#include "kolo/trace.h"

namespace kolo::comm::detail {

/// Marks entry `flightId` failed with `error` and writes this rank's flight recorder (when
/// KOLO_DEBUG_DIR is set), saying so on stderr with `reason`.
void dumpFlightRecorder(uint64_t flightId, const char* error, const char* reason);

/// Marks entry `flightId` failed with the error's message; a Timeout or a Mismatch also
/// writes the flight recorder (dumpFlightRecorder).
void recordFailure(uint64_t flightId, const std::exception& error);

/// The description of a send or receive: `op` ("send", "irecv"...) must be a literal.
flight::Description pointToPoint(const char* op, int rank, int size, uint32_t context, size_t count, DType dtype,
                                 int peer);

/// Runs a blocking operation `body` as entry `d` (started now) and a span named `d.op` with
/// its bytes, sequence number, peer and algorithm. `d.op` and `d.algorithm` must be literals
/// (the span keeps the pointers). Rethrows what `body` throws, after recording it.
template <class Body>
void observedBlocking(const flight::Description& d, Body&& body) {
  const BlockedTime blocked;
  const uint64_t id = flight::enabled() ? flight::begin(d, true) : 0;
  trace::Scope span(d.op, "comm");
  span.bytes(d.bytes);
  if (d.seq >= 0) span.seq(d.seq);
  if (d.peer >= 0) span.peer(d.peer);
  if (d.algorithm != nullptr && *d.algorithm != '\0') span.detail(d.algorithm);
  try {
    body();
  } catch (const std::exception& e) {
    recordFailure(id, e);
    throw;
  }
  flight::finished(id);
}

/// A non-blocking operation's records, from issue to completion. Movable, not copyable.
class PendingOp {
 public:
  PendingOp() = default;
  /// Enters `d` as started now and opens an asynchronous span named `d.op` (a literal, as
  /// `d.algorithm`).
  explicit PendingOp(const flight::Description& d);
  /// Takes over entry `flightId`, already begun for `d`, and opens the span at `beginNs`.
  PendingOp(const flight::Description& d, uint64_t flightId, int64_t beginNs);
  PendingOp(PendingOp&& other) noexcept;
  PendingOp& operator=(PendingOp&& other) noexcept;
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;

  /// Completed: the entry is done and the span ends now. Only the first of done() and a final
  /// fail() counts.
  void done();
  /// Failed with `error` (a Timeout or Mismatch also dumps the recorder). `final` false (a
  /// Timeout after which a later wait may still succeed) leaves the operation open.
  void fail(const std::exception& error, bool final);
  bool open() const { return open_; }

 private:
  void closeSpan();

  uint64_t flightId_ = 0;
  trace::Span span_;
  bool open_ = false;
};

/// Wraps `inner` so that its completion, seen by wait() or test(), finishes `op`.
std::unique_ptr<Work> observeWork(std::unique_ptr<Work> inner, PendingOp op);

}  // namespace kolo::comm::detail
