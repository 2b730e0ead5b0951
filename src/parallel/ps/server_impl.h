// The parameter server: its slices of the parameters in one flat f32 buffer, an optimizer
// over views of it, and one thread per connection. Protocol per mode (all under one mutex):
//   sync:  a push parks the worker's gradient; when every worker still in the job (not lost,
//          not left) has parked one, their mean (summed in worker order, so the result does
//          not depend on arrival order) is applied once, and every parked worker gets the new
//          values. A worker that leaves or is lost shrinks the round it was missing from.
//   async: a push is applied at once and answered with the current values.
//   ssp:   as async, but the answer waits while the worker's push count is more than S ahead
//          of the slowest worker still in the job: the worker cannot start its next step.
// A worker whose connection drops, or whom the chief drops (missed heartbeats), is lost: it
// leaves the rounds and the slowest for good. A client on this host may offer a shared-memory
// segment right after its hello (Share): the server then reads its pushes from the segment and
// writes its replies there, and the socket carries only the headers. The values themselves
// live in shared memory too, which such a client maps: a sync reply then only tells it to read
// them there (see push()), and the server copies nothing.
//
// This private header declares the server's state, shared by its two halves: server.cc
// (connections: the hello, requests and replies) and server_rounds.cc (the update protocol:
// sync rounds, async and SSP pushes, the optimizer step).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"
#include "parallel/ps/compress.h"
#include "parallel/ps/server_state.h"
#include "parallel/ps/shared_exchange.h"
#include "parallel/ps/socket.h"
#include "parallel/ps/wire.h"

namespace kolo::parallel::ps {

class ParameterServer::Impl {
  using Header = detail::Header;
  using SharedValues = detail::SharedValues;
  using Socket = detail::Socket;

 public:
  Impl(ServerOptions options, Placement placement, const NamedTensors& initial,
       const OptimizerFactory& makeOptimizer, std::function<double(int64_t)> lrAt);

  ~Impl();

  uint16_t port() const { return port_; }

  void serve();

  void stop();

  ServerStats stats() const;

  std::vector<float> values() const;

 private:
  struct Worker {
    bool left = false;  // left the rounds (idle or finished) until its next push
    bool lost = false;  // its connection dropped without leaving
    bool connected = false;
    int fd = -1;          // its connection while served (shut down when dropped)
    bool parked = false;  // sync: its gradient waits for the round
    int64_t basis = 0;    // the version its parked gradient was computed on
    int64_t clock = 0;    // pushes so far (SSP)
    // The last push, owned by its connection until parked: `gradient`, or the gradients of
    // its shared segment (which stays mapped until its connection is over).
    float* pushed = nullptr;
    std::vector<float> gradient;   // the last push received over the socket
    std::vector<uint16_t> packed;  // bf16/fp16: the push as it arrived
  };

  /// A connection's reply buffers and, when it shares memory, its segment; `data` points at
  /// the bytes to send.
  struct Reply {
    bool inPlace = false;  // the request's client reads the values from sharedValues_
    bool bf16 = false;     // this connection exchanges 16-bit values (bf16 or fp16)
    bool fp16 = false;     // ... fp16, scaled by 2^exponent
    int exponent = 0;
    detail::SharedExchange shared;  // valid: values go to its values(), not onto the socket
    float* values = nullptr;        // where snapshots of the values go: `own` or the segment
    std::vector<float> own;
    std::vector<uint16_t> packed;
    const void* data = nullptr;
  };

  std::string name() const { return "parameter server " + std::to_string(options_.index); }
  Clock::time_point deadline() const { return detail::deadlineAfter(options_.timeout); }
  bool inJob(const Worker& w) const { return !w.left && !w.lost; }
  /// Whether clients that share memory may read the values in place: in sync only, where
  /// they cannot change while a worker in the rounds reads them.
  bool valuesOffered() const { return sharedValues_ != nullptr; }

  void serveConnection(Socket& socket);

  /// Serves one request; false when the connection should end (Shutdown).
  bool handle(Socket& socket, const Header& request, int worker, Reply& out);

  /// Checkpoint and Restore: receives the path that follows `request`, runs `act` on it under
  /// the lock, and replies the version, or an error naming the path ("could not `verb` …").
  void serveStateFile(Socket& socket, const Header& request, const char* verb,
                      const std::function<void(const std::string&)>& act);

  /// Copies (or packs) the values into `out` (under the lock), points out.data at the reply's
  /// bytes and returns the version.
  int64_t snapshot(Reply& out);

  int64_t wireBytes(bool bf16) const { return elements_ * (bf16 ? 2 : 4); }

  /// The values themselves as the reply to `out` (under the lock, counted as sent).
  const void* ownValues(const Reply& out);

  /// Where `out` takes snapshots of the values: its segment, or a buffer of its own.
  float* valuesTarget(Reply& out) const;

  /// Sends `bytes`, the values as `out` packs them (f32 when `bytes` is the server's own);
  /// to a connection that shares memory, only the header: b = 1 when the client reads the
  /// server's own values in place, else they are copied into its segment first.
  void sendValues(Socket& socket, int64_t version, const void* bytes, Reply& out);

  /// Applies a push of `gradient` as the mode says; *reply is where the bytes to send back
  /// are: `out` (a copy taken under the lock) or, in sync without compression, the values
  /// themselves.
  int64_t push(int worker, int64_t basis, float* gradient, Reply& out, const void** reply);

  /// The smallest push count of the workers in the job, `except` left out (-1: none).
  int64_t slowestClock(int except) const;

  std::string missingWorkers() const;

  void noteStaleness(int64_t staleness);

  /// Sync: applies the round when every worker in the job has parked its gradient.
  void completeRoundIfReady();

  /// sum_ = the mean of `pushes`, summed in their order and divided, not multiplied by 1/W
  /// (the mean as the Reducer, and one device, rounds it). A block at a time, so that the
  /// pushes are read once and sum_ stays in cache until it is divided.
  void meanOf(const std::vector<const float*>& pushes);

  /// One optimizer step with `gradient` (a flat buffer in message order).
  void applyUpdate(const float* gradient);

  ServerOptions options_;
  Placement placement_;
  std::vector<Slice> slices_;
  std::vector<int64_t> offsets_;
  int64_t elements_ = 0;
  std::shared_ptr<SharedValues> sharedValues_;  // null: not sync, or shared memory was short
  Tensor values_;       // (elements,) this server's slices in message order, in sharedValues_
  NamedTensors views_;  // the slices as views of values_, named as the optimizer knows them
  std::vector<float> sum_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::function<double(int64_t)> lrAt_;
  Socket listener_;
  uint16_t port_ = 0;
  std::string hostId_;  // clients with the same one may share memory (comm::detail::machineHostId)

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::atomic<bool> stopping_{false};
  int64_t version_ = 0;
  std::deque<Worker> workers_;
  ServerStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace kolo::parallel::ps
