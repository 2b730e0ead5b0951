// The TCP store server: one thread runs a poll() loop over the listening sockets, a wake
// pipe and every connection. Requests are parsed from per-connection buffers; get/wait
// whose keys are missing are parked with their deadline and answered when a set/add makes
// them ready or the deadline passes. Connections that present a wrong token, send an
// oversized frame or a malformed request are closed; everyone else carries on.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "comm/socket.h"
#include "comm/store/store_detail.h"
#include "comm/store/tcp_wire.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {

using Clock = std::chrono::steady_clock;
using detail::StoreOp;
using detail::StoreStatus;
using detail::WireWriter;

namespace {

/// A get or wait that arrived before its keys; answered later.
struct Parked {
  StoreOp op = StoreOp::Get;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

struct Connection {
  int fd = -1;
  bool authenticated = false;
  bool closing = false;  // close once `out` is drained (not used for rejections)
  Bytes in;
  Bytes out;
  size_t outSent = 0;
  std::optional<Parked> parked;
};

bool sameToken(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  // Look at every byte wherever the first difference is, so timing says nothing.
  unsigned diff = 0;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(expected[i]);
  return diff == 0;
}

}  // namespace

class TcpStoreServer::Impl {
 public:
  explicit Impl(const TcpStoreServerOptions& options) : options_(options) {
    bindListeners();
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      closeListeners();
      KOLO_THROW(IoError, "TCP store: cannot create wake pipe: ", std::strerror(errno));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() {
    stop();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  void stop() {
    if (stopped_.exchange(true)) return;
    char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &byte, 1);
    if (thread_.joinable()) thread_.join();
    for (auto& c : connections_) ::close(c.fd);
    connections_.clear();
    closeListeners();
  }

  uint16_t port() const { return port_; }
  uint64_t rejected() const { return rejected_.load(); }
  TcpStoreServerStats stats() const {
    TcpStoreServerStats s;
    s.requests = requests_.load(std::memory_order_relaxed);
    s.bytesReceived = bytesReceived_.load(std::memory_order_relaxed);
    s.bytesSent = bytesSent_.load(std::memory_order_relaxed);
    s.connections = accepted_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void bindListeners() {
    detail::ListenOptions listen;
    listen.reuseAddress = true;
    listen.nonBlocking = true;
    std::string error;
    listeners_ = detail::listenTcp(options_.host, options_.port, listen, &error);
    if (listeners_.empty())
      KOLO_THROW(IoError, "TCP store: cannot listen on ",
                 options_.host.empty() ? std::string("every interface") : options_.host, " port ",
                 options_.port, ": ", error);
    port_ = detail::boundPort(listeners_.front());
  }

  void closeListeners() {
    for (int fd : listeners_) ::close(fd);
    listeners_.clear();
  }

  void loop() {
    std::vector<pollfd> fds;
    while (!stopped_.load()) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      for (int fd : listeners_) fds.push_back({fd, POLLIN, 0});
      for (auto& c : connections_) {
        short events = c.parked ? 0 : POLLIN;  // a client waits for its reply before sending more
        if (c.outSent < c.out.size()) events |= POLLOUT;
        fds.push_back({c.fd, events, 0});
      }
      ::poll(fds.data(), fds.size(), pollTimeoutMs());
      if (fds[0].revents) break;
      size_t index = 1;
      for (size_t i = 0; i < listeners_.size(); ++i, ++index)
        if (fds[index].revents & POLLIN) acceptAll(listeners_[i]);
      // Connections accepted just now are not in `fds`; only the first `served` are.
      size_t served = fds.size() - index;
      for (size_t i = 0; i < served; ++i) {
        short revents = fds[index + i].revents;
        Connection& c = connections_[i];
        if (revents & (POLLIN | POLLHUP | POLLERR)) readFrom(c);
        if (!c.closing && (revents & POLLOUT)) writeTo(c);
      }
      expireParked();
      resumeBuffered();
      std::erase_if(connections_, [](const Connection& c) {
        if (c.closing) ::close(c.fd);
        return c.closing;
      });
    }
  }

  int pollTimeoutMs() const {
    auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (const auto& c : connections_)
      if (c.parked) next = std::min(next, c.parked->deadline);
    if (next == Clock::time_point::max()) return -1;
    if (next <= now) return 0;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    return static_cast<int>(std::min<int64_t>(ms, 60'000));
  }

  void acceptAll(int listener) {
    for (;;) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;  // EAGAIN, or a transient error: the next poll retries
      detail::setNoDelayAndKeepAlive(fd);
      accepted_.fetch_add(1, std::memory_order_relaxed);
      Connection c;
      c.fd = fd;
      connections_.push_back(std::move(c));
    }
  }

  void reject(Connection& c) {
    c.closing = true;
    c.parked.reset();
    rejected_.fetch_add(1);
  }

  void readFrom(Connection& c) {
    uint8_t chunk[65536];
    for (;;) {
      ssize_t n = ::recv(c.fd, chunk, sizeof chunk, 0);
      if (n == 0) {
        c.closing = true;  // the client went away
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.closing = true;
        break;
      }
      bytesReceived_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      c.in.insert(c.in.end(), chunk, chunk + n);
      if (!parseFrames(c)) return;
      if (c.parked || static_cast<size_t>(n) < sizeof chunk) break;
    }
  }

  /// Handles every complete frame in c.in; false when the connection was rejected.
  bool parseFrames(Connection& c) {
    size_t offset = 0;
    while (!c.parked && c.in.size() - offset >= 4) {
      uint32_t length;
      std::memcpy(&length, c.in.data() + offset, 4);
      // Check the announced length before buffering more: untrusted peers must not make
      // the server allocate, and an unauthenticated one gets room for a Hello only.
      uint64_t limit = c.authenticated ? options_.maxValueBytes + options_.maxKeyBytes + 64
                                       : detail::kMaxHelloFrame;
      if (length == 0 || length > limit) {
        reject(c);
        return false;
      }
      if (c.in.size() - offset - 4 < length) break;
      bool ok = handle(c, c.in.data() + offset + 4, length);
      offset += 4 + length;
      if (!ok) {
        reject(c);
        return false;
      }
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(offset));
    return true;
  }

  /// Serves one request; false when it is malformed or not allowed (connection closes).
  bool handle(Connection& c, const uint8_t* body, size_t length) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    detail::StoreRequest request;
    try {
      request = detail::parseStoreRequest(body, length, c.authenticated, options_.maxKeyBytes,
                                          options_.maxValueBytes);
    } catch (const FormatError&) {
      return false;
    }
    switch (request.op) {
      case StoreOp::Hello:
        if (!sameToken(request.token, options_.token)) return false;
        c.authenticated = true;
        reply(c, WireWriter().u8(static_cast<uint8_t>(StoreStatus::Ok)));
        return true;
      case StoreOp::Set:
        values_[request.keys[0]] = std::move(request.value);
        reply(c, WireWriter().u8(static_cast<uint8_t>(StoreStatus::Ok)));
        wakeParked();
        return true;
      case StoreOp::Get:
      case StoreOp::Wait: {
        Parked parked;
        parked.op = request.op;
        parked.keys = std::move(request.keys);
        parked.deadline = detail::deadlineAfter(
            Millis(static_cast<int64_t>(std::min<uint64_t>(request.timeoutMs, INT64_MAX / 2))));
        c.parked = std::move(parked);
        tryAnswer(c);
        return true;
      }
      case StoreOp::Add: {
        const std::string& key = request.keys[0];
        auto it = values_.find(key);
        int64_t result = 0;
        try {
          result = detail::addToCounter(key, it == values_.end() ? nullptr : &it->second,
                                        request.delta);
        } catch (const InvalidArgument& e) {
          reply(c, WireWriter().u8(static_cast<uint8_t>(StoreStatus::Error)).str(e.what()));
          return true;
        }
        values_[key] = detail::encodeCounter(result);
        reply(c, WireWriter()
                     .u8(static_cast<uint8_t>(StoreStatus::Ok))
                     .u64(static_cast<uint64_t>(result)));
        wakeParked();
        return true;
      }
      case StoreOp::Remove: {
        bool existed = values_.erase(request.keys[0]) > 0;
        reply(c, WireWriter().u8(static_cast<uint8_t>(StoreStatus::Ok)).u8(existed ? 1 : 0));
        return true;
      }
      case StoreOp::Check: {
        bool all = true;
        for (const auto& key : request.keys) all = values_.count(key) > 0 && all;
        reply(c, WireWriter().u8(static_cast<uint8_t>(StoreStatus::Ok)).u8(all ? 1 : 0));
        return true;
      }
    }
    return false;
  }

  void reply(Connection& c, WireWriter& writer) {
    Bytes frame = writer.finish();
    if (c.outSent == c.out.size()) {
      c.out.clear();
      c.outSent = 0;
    }
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    writeTo(c);
  }

  void writeTo(Connection& c) {
    while (c.outSent < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.outSent, c.out.size() - c.outSent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.closing = true;
        return;
      }
      c.outSent += static_cast<size_t>(n);
      bytesSent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
  }

  /// Answers c's parked request if its keys all exist now.
  bool tryAnswer(Connection& c) {
    const Parked& p = *c.parked;
    for (const auto& key : p.keys)
      if (!values_.count(key)) return false;
    WireWriter out;
    out.u8(static_cast<uint8_t>(StoreStatus::Ok));
    if (p.op == StoreOp::Get) out.bytes(values_[p.keys[0]]);
    c.parked.reset();
    reply(c, out);
    return true;
  }

  /// Serves requests that were buffered behind a parked one which has since been answered
  /// (a pipelining client); repeats because serving them may answer further parked ones.
  void resumeBuffered() {
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& c : connections_) {
        if (c.closing || c.parked || c.in.size() < 4) continue;
        size_t before = c.in.size();
        parseFrames(c);
        progress = progress || c.in.size() != before;
      }
    }
  }

  void wakeParked() {
    for (auto& c : connections_)
      if (c.parked && !c.closing) tryAnswer(c);
  }

  void expireParked() {
    auto now = Clock::now();
    for (auto& c : connections_) {
      if (!c.parked || c.closing || c.parked->deadline > now) continue;
      WireWriter out;
      out.u8(static_cast<uint8_t>(StoreStatus::Timeout));
      std::vector<std::string> missing;
      for (const auto& key : c.parked->keys)
        if (!values_.count(key)) missing.push_back(key);
      out.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& key : missing) out.str(key);
      c.parked.reset();
      reply(c, out);
    }
  }

  TcpStoreServerOptions options_;
  std::vector<int> listeners_;
  uint16_t port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> requests_{0}, bytesReceived_{0}, bytesSent_{0}, accepted_{0};
  std::vector<Connection> connections_;
  std::map<std::string, Bytes> values_;
  std::thread thread_;
};

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
TcpStoreServer::~TcpStoreServer() = default;
uint16_t TcpStoreServer::port() const { return impl_->port(); }
uint64_t TcpStoreServer::rejectedConnections() const { return impl_->rejected(); }
TcpStoreServerStats TcpStoreServer::stats() const { return impl_->stats(); }
void TcpStoreServer::stop() { impl_->stop(); }

}  // namespace kolo::comm
