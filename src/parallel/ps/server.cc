// The parameter server's connections (server_impl.h): one thread per connection takes the
// hello, serves the requests and sends the values back, over the socket or through a client's
// shared-memory segment; the update protocol is server_rounds.cc's.
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "parallel/ps/server_impl.h"

namespace kolo::parallel::ps {

using namespace detail;

namespace {
constexpr int64_t kStatsFields = 10;
}  // namespace

ParameterServer::Impl::Impl(ServerOptions options, Placement placement, const NamedTensors& initial,
                            const OptimizerFactory& makeOptimizer,
                            std::function<double(int64_t)> lrAt)
    : options_(std::move(options)),
      placement_(std::move(placement)),
      slices_(placement_.slicesOf(options_.index)),
      lrAt_(std::move(lrAt)),
      workers_(static_cast<size_t>(options_.workers)) {
  KOLO_REQUIRE(options_.workers >= 1, "a parameter server needs at least 1 worker, got ",
               options_.workers);
  KOLO_REQUIRE(options_.staleness >= 0, "ServerOptions::staleness must be at least 0, got ", options_.staleness);
  KOLO_REQUIRE(initial.size() == placement_.names.size(), "parameter server: ", initial.size(),
               " initial parameters for a placement of ", placement_.names.size());
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
    KOLO_REQUIRE(tensor.numel() == placement_.sizes[static_cast<size_t>(s.parameter)], "parameter server: ",
                 name, " has ", tensor.numel(), " elements, the placement ",
                 placement_.sizes[static_cast<size_t>(s.parameter)]);
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

ParameterServer::Impl::~Impl() {
  stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void ParameterServer::Impl::serve() {
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

void ParameterServer::Impl::stop() {
  stopping_ = true;
  changed_.notify_all();
}

ServerStats ParameterServer::Impl::stats() const {
  std::lock_guard lock(mutex_);
  ServerStats s = stats_;
  s.updates = version_;
  return s;
}

std::vector<float> ParameterServer::Impl::values() const {
  std::lock_guard lock(mutex_);
  return std::vector<float>(values_.data<float>(), values_.data<float>() + elements_);
}

void ParameterServer::Impl::serveConnection(Socket& socket) {
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

bool ParameterServer::Impl::handle(Socket& socket, const Header& request, int worker, Reply& out) {
  const auto op = static_cast<Op>(request.op);
  if (op == Op::Push && worker < 0)
    KOLO_THROW(FormatError, "the chief pushed gradients to ", name());
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
      float* gradient = out.shared.valid()
                            ? out.shared.gradients()
                            : recvGradients(socket, request, out.fp16, out.bf16, elements_,
                                            w.packed, w.gradient, deadline());
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
    case Op::Checkpoint:
      serveStateFile(socket, request, "write", [&](const std::string& path) {
        saveServerState(path, options_.index, views_, *optimizer_, version_);
      });
      return true;
    case Op::Restore:
      if (worker >= 0)
        KOLO_THROW(FormatError, socket.peer(), " sent a restore request to ", name());
      serveStateFile(socket, request, "restore", [&](const std::string& path) {
        version_ = restoreServerState(path, options_.index, views_, *optimizer_);
      });
      return true;
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

int64_t ParameterServer::Impl::snapshot(Reply& out) {
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

const void* ParameterServer::Impl::ownValues(const Reply& out) {
  stats_.bytesOut += wireBytes(false);
  if (out.inPlace) ++stats_.valuesInPlace;
  return values_.data<float>();
}

float* ParameterServer::Impl::valuesTarget(Reply& out) const {
  if (out.values == nullptr) {
    out.own.resize(static_cast<size_t>(elements_));
    out.values = out.own.data();
  }
  return out.values;
}

void ParameterServer::Impl::serveStateFile(Socket& socket, const Header& request, const char* verb,
                                           const std::function<void(const std::string&)>& act) {
  std::string path(request.payload, '\0');
  socket.recvAll(path.data(), path.size(), deadline(), "the checkpoint path");
  try {
    std::lock_guard lock(mutex_);
    act(path);
  } catch (const Error& e) {
    detail::sendError(socket, name() + " could not " + verb + " " + path + ": " + e.what(), deadline());
    return;
  }
  const Header ok = detail::reply(Status::Ok, version_);
  socket.sendAll(&ok, sizeof ok, deadline(), (std::string("the ") + verb + " reply").c_str());
}

void ParameterServer::Impl::sendValues(Socket& socket, int64_t version, const void* bytes,
                                       Reply& out) {
  if (out.shared.valid()) {
    const bool inPlace = out.inPlace && bytes == values_.data<float>();
    if (!inPlace && bytes != out.values)
      std::memcpy(out.values, bytes, static_cast<size_t>(elements_) * sizeof(float));
    const Header ok = detail::reply(Status::Ok, version, inPlace ? 1 : 0);
    socket.sendAll(&ok, sizeof ok, deadline(), "the parameters");
    return;
  }
  const int64_t size = wireBytes(out.bf16);
  const Header ok =
      detail::reply(Status::Ok, version, out.fp16 ? out.exponent : 0, static_cast<uint64_t>(size));
  iovec parts[2] = {{const_cast<Header*>(&ok), sizeof ok},
                    {const_cast<void*>(bytes), static_cast<size_t>(size)}};
  socket.sendAll(parts, 2, deadline(), "the parameters");
}

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
