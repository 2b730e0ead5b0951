// Internal seam between transports and collective algorithms.
// A Links object is one rank's view of a group: ordered, reliable byte streams to every
// peer. Algorithms (src/comm/algorithms/) are written only against this interface; the
// native communicator implements it over shared memory and TCP, and tests implement it
// over threads. The implementation stamps every message with the current collective's
// sequence number and signature and checks the stamp on receipt (throwing Mismatch), and
// enforces the deadline on every wait (throwing Timeout / IoError naming the peer).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "kolo/comm/communicator.h"

namespace kolo::comm::detail {

class Links {
 public:
  virtual ~Links() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Whether peer runs on this rank's host (shared memory reachable).
  virtual bool sameHost(int peer) const = 0;

  /// Messages between a pair of ranks arrive in the order they were sent. A send may
  /// complete before the receiver posts its recv (buffered) or not (rendezvous): an
  /// algorithm must never rely on either, so two ranks exchanging data use isend + recv.
  virtual void send(int peer, const void* data, size_t bytes) = 0;
  /// Receives exactly `bytes`; a message of another length is a Mismatch.
  virtual void recv(int peer, void* data, size_t bytes) = 0;
  virtual std::unique_ptr<Work> isend(int peer, const void* data, size_t bytes) = 0;
  virtual std::unique_ptr<Work> irecv(int peer, void* data, size_t bytes) = 0;
};

}  // namespace kolo::comm::detail
