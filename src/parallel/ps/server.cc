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
#include <sys/socket.h>

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

using namespace detail;

namespace {
constexpr int64_t kStatsFields = 10;
}  // namespace

class ParameterServer::Impl {
 public:
  Impl(ServerOptions options, Placement placement, const NamedTensors& initial,
       const OptimizerFactory& makeOptimizer, std::function<double(int64_t)> lrAt)
      : options_(std::move(options)),
        placement_(std::move(placement)),
        slices_(placement_.slicesOf(options_.index)),
        lrAt_(std::move(lrAt)),
        workers_(static_cast<size_t>(options_.workers)) {
    KOLO_REQUIRE(options_.workers >= 1, "a parameter server needs at least 1 worker, got ",
                 options_.workers);
    KOLO_REQUIRE(options_.staleness >= 0, "--staleness must be at least 0, got ",
                 options_.staleness);
    KOLO_CHECK_EQ(initial.size(), placement_.names.size(), "parameters vs placement");
    elements_ = placement_.elementsOf(options_.index);
    // Workers read the values in place only in sync (valuesOffered).
    values_ = serverValues(std::max<int64_t>(elements_, 1),
                           "kolo-ps-values-" + std::to_string(options_.index),
                           options_.mode == Mode::Sync ? &sharedValues_ : nullptr);
    sum_.resize(static_cast<size_t>(elements_));
    NamedTensors views;
    int64_t offset = 0;
    for (const Slice& s : slices_) {
      const auto& [name, tensor] = initial[static_cast<size_t>(s.parameter)];
      KOLO_CHECK_EQ(tensor.numel(), placement_.sizes[static_cast<size_t>(s.parameter)],
                    "elements of ", name);
      const Tensor source = tensor.contiguous();
      std::memcpy(values_.data<float>() + offset, source.data<float>() + s.begin,
                  static_cast<size_t>(s.size()) * 4);
      const bool whole = s.begin == 0 && s.end == tensor.numel();
      views.emplace_back(
          whole ? name : name + "[" + std::to_string(s.begin) + ":" + std::to_string(s.end) + "]",
          values_.slice(0, offset, offset + s.size()));
      offsets_.push_back(offset);
      offset += s.size();
    }
    optimizer_ = makeOptimizer(views);
    views_ = views;
    listener_ = detail::listenOn(options_.host, options_.port, &port_);
    hostId_ = comm::detail::machineHostId();
  }

  ~Impl() {
    stop();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  uint16_t port() const { return port_; }

  void serve() {
    while (!stopping_.load()) {
      Socket socket = detail::acceptFor(listener_, kPollSlice);
      if (!socket.valid()) continue;
      std::lock_guard lock(mutex_);
      threads_.emplace_back([this, s = std::move(socket)]() mutable { serveConnection(s); });
    }
    changed_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  void stop() {
    stopping_ = true;
    changed_.notify_all();
  }

  ServerStats stats() const {
    std::lock_guard lock(mutex_);
    ServerStats s = stats_;
    s.updates = version_;
    return s;
  }

  std::vector<float> values() const {
    std::lock_guard lock(mutex_);
    return std::vector<float>(values_.data<float>(), values_.data<float>() + elements_);
  }

 private:
  struct Worker {
    bool left = false;  // left the rounds (idle or finished) until its next push
    bool lost = false;  // its connection dropped without leaving
    bool connected = false;
    int fd = -1;                   // its connection while served (shut down when dropped)
    bool parked = false;           // sync: its gradient waits for the round
    int64_t basis = 0;             // the version its parked gradient was computed on
    int64_t clock = 0;             // pushes so far (SSP)
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
    bool bf16 = false;  // this connection exchanges 16-bit values (bf16 or fp16)
    bool fp16 = false;  // ... fp16, scaled by 2^exponent
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

  void serveConnection(Socket& socket) {
    int worker = -1;  // -1: the chief
    // Outlives the worker's last round: another thread may sum its segment's gradients until
    // it is unparked below, under the lock.
    Reply out;
    try {
      const Header h = detail::acceptHello(socket, options_.token, deadline());
      const bool chief = h.a == static_cast<int64_t>(ClientRole::Chief);
      if (h.flags > static_cast<uint32_t>(Compression::Fp16)) {
        detail::sendError(socket, name() + " does not know compression " + std::to_string(h.flags),
                          deadline());
        return;
      }
      const bool fp16 = h.flags == static_cast<uint32_t>(Compression::Fp16);
      const bool bf16 = h.flags == static_cast<uint32_t>(Compression::Bf16) || fp16;
      if (!chief) {
        if (h.index >= kMaxWorkers) {
          detail::sendError(socket,
                            name() + " serves workers 0.." + std::to_string(kMaxWorkers - 1) +
                                ", not " + std::to_string(h.index),
                            deadline());
          return;
        }
        std::lock_guard lock(mutex_);
        // A worker beyond the W the job started with joined later: it takes part in the
        // rounds from its first push on (deque: the others' references stay valid).
        while (workers_.size() <= h.index) {
          workers_.emplace_back();
          workers_.back().left = true;
        }
        Worker& w = workers_[h.index];
        if (w.connected || w.lost) {
          detail::sendError(
              socket,
              "worker " + std::to_string(h.index) + " is already (or was) connected to " + name(),
              deadline());
          return;
        }
        w.connected = true;
        w.fd = socket.fd();
        worker = static_cast<int>(h.index);
      }
      socket.setPeer(chief ? std::string("the chief") : "worker " + std::to_string(worker));
      const Header ok = detail::reply(Status::Ok, 0, elements_);
      socket.sendAll(&ok, sizeof ok, deadline(), "the hello reply");
      out.bf16 = bf16;
      out.fp16 = fp16;
      if (bf16) out.packed.resize(static_cast<size_t>(elements_));
      while (!stopping_.load()) {
        if (!socket.waitReadable(kPollSlice)) continue;
        const Header request = detail::recvHeader(socket, deadline(), "a request");
        if (!handle(socket, request, worker, out)) break;
      }
    } catch (const Error& e) {
      // The connection is over; a worker that had not left is lost and its rounds go on
      // without it.
      (void)e;
    }
    if (worker >= 0) {
      std::lock_guard lock(mutex_);
      Worker& w = workers_[static_cast<size_t>(worker)];
      w.fd = -1;
      if (!w.left && !w.lost) {
        w.lost = true;
        ++stats_.workersLost;
      }
      w.parked = false;
      w.pushed = nullptr;
      completeRoundIfReady();
      changed_.notify_all();
    }
  }

  /// Serves one request; false when the connection should end (Shutdown).
  bool handle(Socket& socket, const Header& request, int worker, Reply& out) {
    const auto op = static_cast<Op>(request.op);
    if (op == Op::Push && worker < 0) KOLO_THROW(FormatError, "the chief pushed gradients to ", name());
    checkServerRequest(request, out.shared.valid() ? 0 : wireBytes(out.bf16), socket.peer(), name());
    out.inPlace = (request.flags & kReadsSharedValues) != 0;
    if (out.inPlace && !(worker >= 0 && out.shared.valid() && valuesOffered()))
      KOLO_THROW(FormatError, socket.peer(), " asked for the values in place from ", name(),
                 ", which shares none with it");
    switch (op) {
      case Op::Pull: {
        int64_t version;
        const void* bytes;
        {
          std::lock_guard lock(mutex_);
          if (out.inPlace) {
            // The worker reads (or computes on) the values in place: no round may complete
            // before its next push, so it is back in the rounds from now on.
            Worker& w = workers_[static_cast<size_t>(worker)];
            if (!w.lost) w.left = false;
            bytes = ownValues(out);
            version = version_;
          } else {
            version = snapshot(out);
            bytes = out.data;
          }
        }
        sendValues(socket, version, bytes, out);
        return true;
      }
      case Op::Push: {
        // The worker's buffers are its connection's until it parks a push: no lock needed.
        Worker& w = workers_[static_cast<size_t>(worker)];
        float* gradient = out.shared.valid() ? out.shared.gradients()
                                             : recvGradients(socket, request, out.fp16, out.bf16,
                                                             elements_, w.packed, w.gradient,
                                                             deadline());
        int64_t version;
        const void* reply = nullptr;
        try {
          version = push(worker, request.a, gradient, out, &reply);
        } catch (const Timeout& e) {
          detail::sendError(socket, e.what(), deadline());
          throw;
        }
        sendValues(socket, version, reply, out);
        return true;
      }
      case Op::Share: {
        if (out.shared.valid())
          KOLO_THROW(FormatError, socket.peer(), " offered a second shared segment to ", name());
        out.shared = acceptOffer(socket, request, hostId_, elements_, out.bf16, deadline());
        if (out.shared.valid()) {
          out.values = out.shared.values();
          std::lock_guard lock(mutex_);
          if (worker >= 0) ++stats_.sharedWorkers;
        }
        answerOffer(socket, out.shared.valid(), valuesOffered() ? sharedValues_.get() : nullptr,
                    deadline());
        return true;
      }
      case Op::Leave: {
        if (worker >= 0) {
          std::lock_guard lock(mutex_);
          workers_[static_cast<size_t>(worker)].left = true;
          completeRoundIfReady();
          changed_.notify_all();
        }
        const Header ok = detail::reply(Status::Ok);
        socket.sendAll(&ok, sizeof ok, deadline(), "the leave reply");
        return true;
      }
      case Op::Stats: {
        const ServerStats s = stats();
        const int64_t fields[kStatsFields] = {
            s.updates,      s.pushes,  s.bytesIn,     s.bytesOut,      s.stalenessMax,
            s.stalenessSum, s.leadMax, s.workersLost, s.sharedWorkers, s.valuesInPlace};
        const Header ok = detail::reply(Status::Ok, s.updates, 0, sizeof fields);
        iovec parts[2] = {{const_cast<Header*>(&ok), sizeof ok},
                          {const_cast<int64_t*>(fields), sizeof fields}};
        socket.sendAll(parts, 2, deadline(), "the statistics");
        return true;
      }
      case Op::Checkpoint: {
        std::string path(request.payload, '\0');
        socket.recvAll(path.data(), path.size(), deadline(), "the checkpoint path");
        try {
          std::lock_guard lock(mutex_);
          saveServerState(path, options_.index, views_, *optimizer_, version_);
        } catch (const Error& e) {
          detail::sendError(socket, name() + " could not write " + path + ": " + e.what(),
                            deadline());
          return true;
        }
        const Header ok = detail::reply(Status::Ok, version_);
        socket.sendAll(&ok, sizeof ok, deadline(), "the checkpoint reply");
        return true;
      }
      case Op::Restore: {
        if (worker >= 0)
          KOLO_THROW(FormatError, socket.peer(), " sent a restore request to ", name());
        std::string path(request.payload, '\0');
        socket.recvAll(path.data(), path.size(), deadline(), "the checkpoint path");
        try {
          std::lock_guard lock(mutex_);
          version_ = restoreServerState(path, options_.index, views_, *optimizer_);
        } catch (const Error& e) {
          detail::sendError(socket, name() + " could not restore " + path + ": " + e.what(),
                            deadline());
          return true;
        }
        const Header ok = detail::reply(Status::Ok, version_);
        socket.sendAll(&ok, sizeof ok, deadline(), "the restore reply");
        return true;
      }
      case Op::Drop: {
        if (worker >= 0) KOLO_THROW(FormatError, socket.peer(), " sent a drop request to ", name());
        {
          std::lock_guard lock(mutex_);
          if (request.index < workers_.size()) {
            Worker& w = workers_[request.index];
            if (!w.lost) ++stats_.workersLost;
            w.lost = true;
            w.parked = false;
            if (w.fd >= 0) ::shutdown(w.fd, SHUT_RDWR);
            completeRoundIfReady();
            changed_.notify_all();
          }
        }
        const Header ok = detail::reply(Status::Ok);
        socket.sendAll(&ok, sizeof ok, deadline(), "the drop reply");
        return true;
      }
      case Op::Shutdown: {
        const Header ok = detail::reply(Status::Ok);
        socket.sendAll(&ok, sizeof ok, deadline(), "the shutdown reply");
        stop();
        return false;
      }
      default:
        return false;  // not reached: checkServerRequest refuses unknown requests
    }
  }

  /// Copies (or packs) the values into `out` (under the lock), points out.data at the reply's
  /// bytes and returns the version.
  int64_t snapshot(Reply& out) {
    if (out.fp16) {
      const float* values = values_.data<float>();
      out.exponent = detail::halfExponent(detail::maxAbs(values, out.packed.size()));
      detail::packHalf(values, out.packed.data(), out.packed.size(), out.exponent);
      out.data = out.packed.data();
    } else if (out.bf16) {
      detail::packBf16(values_.data<float>(), out.packed.data(), out.packed.size());
      out.data = out.packed.data();
    } else {
      std::memcpy(valuesTarget(out), values_.data<float>(), static_cast<size_t>(elements_) * 4);
      out.data = out.values;
    }
    stats_.bytesOut += wireBytes(out.bf16);
    return version_;
  }

  int64_t wireBytes(bool bf16) const { return elements_ * (bf16 ? 2 : 4); }

  /// The values themselves as the reply to `out` (under the lock, counted as sent).
  const void* ownValues(const Reply& out) {
    stats_.bytesOut += wireBytes(false);
    if (out.inPlace) ++stats_.valuesInPlace;
    return values_.data<float>();
  }

  /// Where `out` takes snapshots of the values: its segment, or a buffer of its own.
  float* valuesTarget(Reply& out) const {
    if (out.values == nullptr) {
      out.own.resize(static_cast<size_t>(elements_));
      out.values = out.own.data();
    }
    return out.values;
  }

  /// Sends `bytes`, the values as `out` packs them (f32 when `bytes` is the server's own);
  /// to a connection that shares memory, only the header: b = 1 when the client reads the
  /// server's own values in place, else they are copied into its segment first.
  void sendValues(Socket& socket, int64_t version, const void* bytes, Reply& out) {
    if (out.shared.valid()) {
      const bool inPlace = out.inPlace && bytes == values_.data<float>();
      if (!inPlace && bytes != out.values)
        std::memcpy(out.values, bytes, static_cast<size_t>(elements_) * sizeof(float));
      const Header ok = detail::reply(Status::Ok, version, inPlace ? 1 : 0);
      socket.sendAll(&ok, sizeof ok, deadline(), "the parameters");
      return;
    }
    const int64_t size = wireBytes(out.bf16);
    const Header ok = detail::reply(Status::Ok, version, out.fp16 ? out.exponent : 0,
                                    static_cast<uint64_t>(size));
    iovec parts[2] = {{const_cast<Header*>(&ok), sizeof ok},
                      {const_cast<void*>(bytes), static_cast<size_t>(size)}};
    socket.sendAll(parts, 2, deadline(), "the parameters");
  }

  /// Applies a push of `gradient` as the mode says; *reply is where the bytes to send back
  /// are: `out` (a copy taken under the lock) or, in sync without compression, the values
  /// themselves.
  int64_t push(int worker, int64_t basis, float* gradient, Reply& out, const void** reply) {
    std::unique_lock lock(mutex_);
    const int64_t staleness = stalenessOf(version_, basis, "worker " + std::to_string(worker), name());
    Worker& w = workers_[static_cast<size_t>(worker)];
    w.pushed = gradient;
    if (w.lost) KOLO_THROW(PeerError, name(), " dropped worker ", worker, " (no heartbeat)");
    if (w.left) {
      // Back from idling: in SSP it starts level with the slowest of the others, so that the
      // time it sat out does not hold everyone back.
      w.left = false;
      if (options_.mode == Mode::Ssp) w.clock = std::max(w.clock, slowestClock(worker));
    }
    ++stats_.pushes;
    stats_.bytesIn += wireBytes(out.bf16);
    const auto until = deadline();
    if (options_.mode == Mode::Sync) {
      w.parked = true;
      w.basis = basis;
      const int64_t round = version_;
      completeRoundIfReady();
      while (w.parked && !stopping_.load()) {
        if (changed_.wait_until(lock, until) == std::cv_status::timeout && w.parked)
          KOLO_THROW(Timeout, name(), ": sync round ", round, " waited ", options_.timeout.count(),
                     " ms for worker(s) ", missingWorkers());
      }
      if (stopping_.load()) KOLO_THROW(PeerError, name(), " is shutting down");
      if (w.lost) KOLO_THROW(PeerError, name(), " dropped worker ", worker, " (no heartbeat)");
      if (out.bf16) {
        const int64_t version = snapshot(out);
        *reply = out.data;
        return version;
      }
      // No copy: the next update needs this worker's next push, which cannot come before it
      // has read this reply, so the values stay as they are while they are sent, or while
      // the worker reads them in the shared file (other requests only read them).
      *reply = ownValues(out);
      return version_;
    }
    noteStaleness(staleness);
    if (options_.stalenessLr && staleness > 1) {
      const float scale = 1.0f / static_cast<float>(staleness);
      for (int64_t i = 0; i < elements_; ++i) gradient[i] *= scale;
    }
    applyUpdate(gradient);
    if (options_.mode == Mode::Ssp) {
      ++w.clock;
      changed_.notify_all();
      // The worker's next step would be number `clock`; it may start it only while it is at
      // most S pushes ahead of the slowest worker still in the job.
      while (w.clock - slowestClock(-1) > options_.staleness && !stopping_.load() && !w.lost) {
        if (changed_.wait_until(lock, until) == std::cv_status::timeout)
          KOLO_THROW(Timeout, name(), ": worker ", worker, " waited ", options_.timeout.count(),
                     " ms for the slowest worker (staleness bound ", options_.staleness, ")");
      }
      stats_.leadMax = std::max(stats_.leadMax, w.clock - slowestClock(-1));
    }
    const int64_t version = snapshot(out);
    *reply = out.data;
    return version;
  }

  /// The smallest push count of the workers in the job, `except` left out (-1: none).
  int64_t slowestClock(int except) const {
    int64_t slowest = INT64_MAX;
    for (size_t i = 0; i < workers_.size(); ++i)
      if (static_cast<int>(i) != except && inJob(workers_[i]))
        slowest = std::min(slowest, workers_[i].clock);
    if (slowest == INT64_MAX) return except >= 0 ? workers_[static_cast<size_t>(except)].clock : 0;
    return slowest;
  }

  std::string missingWorkers() const {
    std::string list;
    for (size_t i = 0; i < workers_.size(); ++i)
      if (inJob(workers_[i]) && !workers_[i].parked)
        list += (list.empty() ? "" : ", ") + std::to_string(i);
    return list;
  }

  void noteStaleness(int64_t staleness) {
    stats_.stalenessMax = std::max(stats_.stalenessMax, staleness);
    stats_.stalenessSum += staleness;
  }

  /// Sync: applies the round when every worker in the job has parked its gradient.
  void completeRoundIfReady() {
    if (options_.mode != Mode::Sync) return;
    std::vector<const float*> pushes;  // in worker order
    for (const Worker& w : workers_) {
      if (w.parked) {
        pushes.push_back(w.pushed);
      } else if (inJob(w)) {
        return;
      }
    }
    if (pushes.empty()) return;
    for (const Worker& w : workers_)
      if (w.parked) noteStaleness(version_ - w.basis);
    meanOf(pushes);
    applyUpdate(sum_.data());
    for (Worker& w : workers_) w.parked = false;
    changed_.notify_all();
  }

  /// sum_ = the mean of `pushes`, summed in their order and divided, not multiplied by 1/W
  /// (the mean as the Reducer, and one device, rounds it). A block at a time, so that the
  /// pushes are read once and sum_ stays in cache until it is divided.
  void meanOf(const std::vector<const float*>& pushes) {
    constexpr int64_t kBlock = 4096;
    const float count = static_cast<float>(pushes.size());
    for (int64_t begin = 0; begin < elements_; begin += kBlock) {
      const int64_t end = std::min(begin + kBlock, elements_);
      float* sum = sum_.data();
      std::copy(pushes[0] + begin, pushes[0] + end, sum + begin);
      for (size_t w = 1; w < pushes.size(); ++w)
        for (int64_t i = begin; i < end; ++i) sum[i] += pushes[w][i];
      if (pushes.size() > 1)
        for (int64_t i = begin; i < end; ++i) sum[i] /= count;
    }
  }

  /// One optimizer step with `gradient` (a flat buffer in message order).
  void applyUpdate(const float* gradient) {
    std::vector<optim::ParameterPart> parts;
    parts.reserve(slices_.size());
    for (size_t i = 0; i < slices_.size(); ++i)
      parts.push_back({0, slices_[i].size(), optim::Gradient{gradient + offsets_[i]}});
    if (lrAt_) optimizer_->setLr(lrAt_(version_));
    optimizer_->stepParts(parts);
    ++version_;
  }

  ServerOptions options_;
  Placement placement_;
  std::vector<Slice> slices_;
  std::vector<int64_t> offsets_;
  int64_t elements_ = 0;
  std::shared_ptr<SharedValues> sharedValues_;  // null: not sync, or shared memory was short
  Tensor values_;  // (elements,) this server's slices in message order, in sharedValues_
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

ParameterServer::ParameterServer(ServerOptions options, Placement placement,
                                 const NamedTensors& initial, const OptimizerFactory& makeOptimizer,
                                 std::function<double(int64_t)> lrAt)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(placement), initial, makeOptimizer,
                                   std::move(lrAt))) {}
ParameterServer::~ParameterServer() = default;
uint16_t ParameterServer::port() const { return impl_->port(); }
void ParameterServer::serve() { impl_->serve(); }
void ParameterServer::stop() { impl_->stop(); }
ServerStats ParameterServer::stats() const { return impl_->stats(); }
std::vector<float> ParameterServer::values() const { return impl_->values(); }

}  // namespace kolo::parallel::ps
