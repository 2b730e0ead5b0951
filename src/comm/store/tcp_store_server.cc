// The TCP store server: one thread runs an epoll loop over the listening sockets, a wake
// pipe and every connection, so that a request costs the same whether 10 or 20,000 clients
// are connected. Requests are parsed from per-connection buffers; a request whose keys are
// missing (get, wait, multi-get) or whose counter is short of its target (arrive) is parked
// with its deadline under the one key it waits for, and looked at again only when that key
// is written: a set wakes the requests parked on its key, not every connection, and the
// last arrival of a barrier answers all its waiters in one pass. Connections that present a
// wrong token, send an oversized frame or a malformed request are closed; everyone else
// carries on. A host store (options.upstream set) reads its ranks' requests the same way but
// serves them through a HostStoreUplink to the root; the uplink's replies come back through
// the wake pipe.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <unordered_map>

#include "comm/socket.h"
#include "comm/store/host_store_uplink.h"
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

/// A get, wait, multi-get or arrive that cannot be answered yet.
struct Parked {
  StoreOp op = StoreOp::Get;
  std::vector<std::string> keys;
  int64_t target = 0;  // Arrive: the count that opens the barrier
  int64_t arrival = 0;  // Arrive: the counter after this arrival
  Clock::time_point deadline;
  uint64_t serial = 0;  // tells this parking apart from earlier ones of the connection
};

struct Connection {
  int fd = -1;
  uint64_t id = 0;
  bool authenticated = false;
  bool closing = false;
  bool wantsOut = false;  // EPOLLOUT registered
  Bytes in;
  Bytes out;
  size_t outSent = 0;
  std::optional<Parked> parked;
};

/// A parked request's registration under a key or in the deadline queue; stale once the
/// connection has gone or has parked again since (its serial moved on).
struct ParkedRef {
  uint64_t connection = 0;
  uint64_t serial = 0;
};

struct Expiry {
  Clock::time_point deadline;
  ParkedRef ref;
  bool operator>(const Expiry& other) const { return deadline > other.deadline; }
};

bool sameToken(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  // Look at every byte wherever the first difference is, so timing says nothing.
  unsigned diff = 0;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(expected[i]);
  return diff == 0;
}

// epoll data: listeners and the wake pipe carry their fd with this tag; connections their id.
constexpr uint64_t kFdTag = uint64_t{1} << 63;

}  // namespace

class TcpStoreServer::Impl {
 public:
  explicit Impl(const TcpStoreServerOptions& options) : options_(options) {
    bindListeners();
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0 || ::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      const int error = errno;
      if (epoll_ >= 0) ::close(epoll_);
      closeListeners();
      KOLO_THROW(IoError, "TCP store: cannot create its event loop: ", std::strerror(error));
    }
    watch(wake_[0], EPOLLIN, kFdTag | static_cast<uint64_t>(wake_[0]));
    for (int fd : listeners_) watch(fd, EPOLLIN, kFdTag | static_cast<uint64_t>(fd));
    if (!options_.upstream.empty()) {
      const HostPort root = parseHostPort(options_.upstream);
      TcpStoreClientOptions client;
      client.host = root.host;
      client.port = root.port;
      client.token = options_.token;
      client.connectTimeout = options_.upstreamTimeout;
      client.requestTimeout = options_.upstreamTimeout;
      try {
        uplink_ = std::make_unique<detail::HostStoreUplink>(
            client, [this](uint64_t id, uint64_t serial, Bytes frame) {
              deliver(id, serial, std::move(frame));
            });
      } catch (...) {
        ::close(epoll_);
        ::close(wake_[0]);
        ::close(wake_[1]);
        closeListeners();
        throw;
      }
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() {
    stop();
    ::close(wake_[0]);
    ::close(wake_[1]);
    ::close(epoll_);
  }

  void stop() {
    // The uplink first: its threads hand replies to this loop until they end.
    if (uplink_) uplink_->stop();
    if (stopped_.exchange(true)) return;
    char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &byte, 1);
    if (thread_.joinable()) thread_.join();
    for (auto& [id, c] : connections_) ::close(c->fd);
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
    listen.backlog = 65535;
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

  void watch(int fd, uint32_t events, uint64_t data) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = data;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event);
  }

  void loop() {
    std::vector<epoll_event> events(1024);
    while (!stopped_.load()) {
      const int ready = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), waitTimeoutMs());
      for (int i = 0; i < ready && !stopped_.load(); ++i) {
        const uint64_t data = events[static_cast<size_t>(i)].data.u64;
        const uint32_t what = events[static_cast<size_t>(i)].events;
        if (data & kFdTag) {
          const int fd = static_cast<int>(data & ~kFdTag);
          if (fd == wake_[0]) {
            if (stopped_.load()) return;
            takeDelivered();
            continue;
          }
          acceptAll(fd);
          continue;
        }
        Connection* c = find(data);
        if (c == nullptr) continue;
        if (what & (EPOLLIN | EPOLLHUP | EPOLLERR)) readFrom(*c);
        if (!c->closing && (what & EPOLLOUT)) writeTo(*c);
        if (c->closing) dropped_.push_back(c->id);
      }
      expireParked();
      resumeBuffered();
      for (uint64_t id : dropped_) close(id);
      dropped_.clear();
    }
  }

  /// From the uplink's threads: a reply for a forwarded request, or an empty frame to close
  /// its connection.
  void deliver(uint64_t id, uint64_t serial, Bytes frame) {
    {
      std::lock_guard lock(deliveredMutex_);
      delivered_.push_back({id, serial, std::move(frame)});
    }
    char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &byte, 1);
  }

  /// Sends the replies the uplink delivered to the connections still waiting for them.
  void takeDelivered() {
    char drain[256];
    while (::read(wake_[0], drain, sizeof drain) > 0) {
    }
    std::vector<Delivered> replies;
    {
      std::lock_guard lock(deliveredMutex_);
      replies.swap(delivered_);
    }
    for (Delivered& d : replies) {
      if (!live({d.connection, d.serial})) continue;
      Connection& c = *find(d.connection);
      c.parked.reset();
      if (d.frame.empty()) {
        c.closing = true;
        dropped_.push_back(c.id);
        continue;
      }
      appendReply(c, d.frame);
      if (c.in.size() >= 4) resumable_.push_back(c.id);
    }
  }

  Connection* find(uint64_t id) {
    auto it = connections_.find(id);
    return it == connections_.end() ? nullptr : it->second.get();
  }

  void close(uint64_t id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    ::close(it->second->fd);  // also leaves the epoll set
    connections_.erase(it);
  }

  int waitTimeoutMs() {
    // Drop stale entries first so that the timeout is a live request's.
    while (!expiries_.empty() && !live(expiries_.top().ref)) expiries_.pop();
    if (!expiries_.empty() || !resumable_.empty()) {
      if (!resumable_.empty()) return 0;
      const auto now = Clock::now();
      const auto next = expiries_.top().deadline;
      if (next <= now) return 0;
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
      return static_cast<int>(std::min<int64_t>(ms, 60'000));
    }
    return -1;
  }

  bool live(const ParkedRef& ref) {
    Connection* c = find(ref.connection);
    return c != nullptr && !c->closing && c->parked && c->parked->serial == ref.serial;
  }

  void acceptAll(int listener) {
    for (;;) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;  // EAGAIN, or a transient error (out of descriptors): epoll retries
      detail::setNoDelayAndKeepAlive(fd);
      accepted_.fetch_add(1, std::memory_order_relaxed);
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->id = ++lastId_;
      watch(fd, EPOLLIN, c->id);
      connections_.emplace(c->id, std::move(c));
    }
  }

  void reject(Connection& c) {
    c.closing = true;
    c.parked.reset();
    rejected_.fetch_add(1);
  }

  void readFrom(Connection& c) {
    uint8_t chunk[16384];
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
      if (static_cast<size_t>(n) < sizeof chunk) break;
    }
    parseFrames(c);
  }

  /// Handles every complete frame in c.in up to a parked request; false when the
  /// connection was rejected.
  bool parseFrames(Connection& c) {
    size_t offset = 0;
    while (!c.parked && !c.closing && c.in.size() - offset >= 4) {
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
    // A client that keeps sending behind a parked request may have at most one more frame
    // buffered; anything beyond is not how a client talks.
    if (c.parked && c.in.size() > options_.maxValueBytes + options_.maxKeyBytes + 68) {
      reject(c);
      return false;
    }
    return true;
  }

  static WireWriter& status(WireWriter& out, StoreStatus s) { return out.u8(static_cast<uint8_t>(s)); }

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
    WireWriter out;
    if (uplink_ && request.op != StoreOp::Hello) {
      // A host store: the request waits for the uplink's reply as a parked one would.
      Parked parked;
      parked.op = request.op;
      parked.serial = ++lastSerial_;
      const auto deadline = detail::deadlineAfter(
          Millis(static_cast<int64_t>(std::min<uint64_t>(request.timeoutMs, INT64_MAX / 2))));
      c.parked = std::move(parked);
      uplink_->submit({c.id, c.parked->serial, std::move(request), deadline});
      return true;
    }
    switch (request.op) {
      case StoreOp::Hello:
        if (!sameToken(request.token, options_.token)) return false;
        c.authenticated = true;
        reply(c, status(out, StoreStatus::Ok));
        return true;
      case StoreOp::Set:
        reply(c, status(out, StoreStatus::Ok));
        store(request.keys[0], std::move(request.value));
        return true;
      case StoreOp::MultiSet:
        reply(c, status(out, StoreStatus::Ok));
        for (size_t i = 0; i < request.keys.size(); ++i) store(request.keys[i], std::move(request.values[i]));
        return true;
      case StoreOp::Get:
      case StoreOp::Wait:
      case StoreOp::MultiGet:
      case StoreOp::Arrive:
      case StoreOp::GetAvailable:
        park(c, std::move(request));
        return true;
      case StoreOp::Add: {
        int64_t result = 0;
        if (!addTo(c, request.keys[0], request.delta, &result)) return true;
        reply(c, status(out, StoreStatus::Ok).u64(static_cast<uint64_t>(result)));
        wake(request.keys[0]);
        return true;
      }
      case StoreOp::CompareSet: {
        const std::string& key = request.keys[0];
        auto it = values_.find(key);
        const bool matches = it == values_.end() ? request.expected.empty() : it->second == request.expected;
        if (matches) {
          store(key, std::move(request.value));
          it = values_.find(key);
        }
        reply(c, status(out, StoreStatus::Ok).bytes(it == values_.end() ? Bytes{} : it->second));
        return true;
      }
      case StoreOp::Remove: {
        auto it = values_.find(request.keys[0]);
        const bool existed = it != values_.end();
        if (existed) {
          storedBytes_ -= it->first.size() + it->second.size();
          values_.erase(it);
        }
        reply(c, status(out, StoreStatus::Ok).u8(existed ? 1 : 0));
        return true;
      }
      case StoreOp::Check: {
        bool all = true;
        for (const auto& key : request.keys) all = values_.count(key) > 0 && all;
        reply(c, status(out, StoreStatus::Ok).u8(all ? 1 : 0));
        return true;
      }
      case StoreOp::CheckEach: {
        status(out, StoreStatus::Ok).u32(static_cast<uint32_t>(request.keys.size()));
        for (const auto& key : request.keys) out.u8(values_.count(key) > 0 ? 1 : 0);
        reply(c, out);
        return true;
      }
    }
    return false;
  }

  /// Adds delta to the counter at key; on a non-counter value replies Error and returns false.
  bool addTo(Connection& c, const std::string& key, int64_t delta, int64_t* result) {
    auto it = values_.find(key);
    try {
      *result = detail::addToCounter(key, it == values_.end() ? nullptr : &it->second, delta);
    } catch (const InvalidArgument& e) {
      WireWriter out;
      reply(c, status(out, StoreStatus::Error).str(e.what()));
      return false;
    }
    storeQuiet(key, detail::encodeCounter(*result));
    return true;
  }

  void storeQuiet(const std::string& key, Bytes value) {
    auto [it, inserted] = values_.try_emplace(key);
    if (inserted) storedBytes_ += key.size();
    storedBytes_ += value.size();
    storedBytes_ -= it->second.size();
    it->second = std::move(value);
  }

  void store(const std::string& key, Bytes value) {
    storeQuiet(key, std::move(value));
    wake(key);
  }

  void park(Connection& c, detail::StoreRequest request) {
    Parked parked;
    parked.op = request.op;
    parked.keys = std::move(request.keys);
    parked.serial = ++lastSerial_;
    parked.deadline = detail::deadlineAfter(
        Millis(static_cast<int64_t>(std::min<uint64_t>(request.timeoutMs, INT64_MAX / 2))));
    if (parked.op == StoreOp::Arrive) {
      // The arrival counts now, whether or not the barrier opens before the deadline.
      parked.target = request.delta;
      if (!addTo(c, parked.keys[0], request.arrivals, &parked.arrival)) return;
      wake(parked.keys[0]);
    }
    c.parked = std::move(parked);
    if (tryAnswer(c)) return;
    expiries_.push({c.parked->deadline, {c.id, c.parked->serial}});
  }

  /// Answers c's parked request if it can be; otherwise registers it under the first key
  /// it still waits for.
  bool tryAnswer(Connection& c) {
    const Parked& p = *c.parked;
    WireWriter out;
    if (p.op == StoreOp::Arrive) {
      auto it = values_.find(p.keys[0]);
      int64_t count = 0;
      try {
        count = detail::parseCounter(p.keys[0], it == values_.end() ? Bytes{} : it->second);
      } catch (const InvalidArgument& e) {
        c.parked.reset();
        reply(c, status(out, StoreStatus::Error).str(e.what()));
        return true;
      }
      if (count < p.target) {
        arrivals_[p.keys[0]].emplace(p.target, ParkedRef{c.id, p.serial});
        return false;
      }
      status(out, StoreStatus::Ok).u64(static_cast<uint64_t>(p.arrival));
    } else if (p.op == StoreOp::GetAvailable) {
      bool any = false;
      for (const auto& key : p.keys) any = any || values_.count(key) > 0;
      if (!any) {
        for (const auto& key : p.keys) waitFor(key, {c.id, p.serial});
        return false;
      }
      availableReply(out, p.keys);
    } else {
      for (const auto& key : p.keys) {
        if (values_.count(key)) continue;
        waitFor(key, {c.id, p.serial});
        return false;
      }
      status(out, StoreStatus::Ok);
      if (p.op == StoreOp::Get) out.bytes(values_[p.keys[0]]);
      if (p.op == StoreOp::MultiGet) {
        out.u32(static_cast<uint32_t>(p.keys.size()));
        for (const auto& key : p.keys) out.bytes(values_[key]);
      }
    }
    c.parked.reset();
    reply(c, out);
    if (c.in.size() >= 4) resumable_.push_back(c.id);
    return true;
  }

  /// Registers a parked request under a key it waits for. A get-available registers under
  /// each of its keys and leaves stale entries under the others when one is written: they
  /// are swept whenever a key's list doubles, so that a key never written holds at most
  /// twice its live waiters.
  void waitFor(const std::string& key, ParkedRef ref) {
    auto& refs = waiters_[key];
    refs.push_back(ref);
    if (refs.size() >= 64 && (refs.size() & (refs.size() - 1)) == 0)
      std::erase_if(refs, [&](const ParkedRef& r) { return !live(r); });
  }

  /// Ok, then for each key whether it exists and its value if it does.
  void availableReply(WireWriter& out, const std::vector<std::string>& keys) {
    status(out, StoreStatus::Ok).u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) {
      auto it = values_.find(key);
      out.u8(it == values_.end() ? 0 : 1);
      if (it != values_.end()) out.bytes(it->second);
    }
  }

  /// Looks again at the requests parked on `key` (it was just written): the arrivals whose
  /// target the counter has reached, and the requests that waited for the key to exist.
  void wake(const std::string& key) {
    if (auto a = arrivals_.find(key); a != arrivals_.end()) {
      auto v = values_.find(key);
      int64_t count = INT64_MIN;
      try {
        if (v != values_.end()) count = detail::parseCounter(key, v->second);
      } catch (const InvalidArgument&) {
        count = INT64_MAX;  // no longer a counter: every arrival gets its error
      }
      std::vector<ParkedRef> open;
      auto& byTarget = a->second;
      while (!byTarget.empty() && byTarget.begin()->first <= count) {
        open.push_back(byTarget.begin()->second);
        byTarget.erase(byTarget.begin());
      }
      if (byTarget.empty()) arrivals_.erase(a);
      for (const ParkedRef& ref : open)
        if (live(ref)) tryAnswer(*find(ref.connection));
    }
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    std::vector<ParkedRef> refs = std::move(it->second);
    waiters_.erase(it);
    for (const ParkedRef& ref : refs) {
      if (!live(ref)) continue;
      tryAnswer(*find(ref.connection));
    }
  }

  /// Serves requests that were buffered behind a parked one which has since been answered
  /// (a pipelining client); serving them may answer further parked ones.
  void resumeBuffered() {
    while (!resumable_.empty()) {
      std::vector<uint64_t> ids;
      ids.swap(resumable_);
      for (uint64_t id : ids) {
        Connection* c = find(id);
        if (c == nullptr || c->closing || c->parked) continue;
        parseFrames(*c);
        if (c->closing) dropped_.push_back(c->id);
      }
    }
  }

  void expireParked() {
    const auto now = Clock::now();
    while (!expiries_.empty() && expiries_.top().deadline <= now) {
      const ParkedRef ref = expiries_.top().ref;
      expiries_.pop();
      if (!live(ref)) continue;
      Connection& c = *find(ref.connection);
      WireWriter out;
      if (c.parked->op == StoreOp::GetAvailable) {
        // Nothing appeared: the answer says so, not a Timeout.
        availableReply(out, c.parked->keys);
        c.parked.reset();
        reply(c, out);
        if (c.in.size() >= 4) resumable_.push_back(c.id);
        continue;
      }
      status(out, StoreStatus::Timeout);
      std::vector<std::string> missing;
      if (c.parked->op == StoreOp::Arrive) {
        missing.push_back(c.parked->keys[0]);
      } else {
        for (const auto& key : c.parked->keys)
          if (!values_.count(key)) missing.push_back(key);
      }
      out.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& key : missing) out.str(key);
      c.parked.reset();
      reply(c, out);
      if (c.in.size() >= 4) resumable_.push_back(c.id);
    }
  }

  void reply(Connection& c, WireWriter& writer) { appendReply(c, writer.finish()); }

  void appendReply(Connection& c, const Bytes& frame) {
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
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          c.closing = true;
          dropped_.push_back(c.id);
        }
        break;
      }
      c.outSent += static_cast<size_t>(n);
      bytesSent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
    // Ask for EPOLLOUT only while bytes wait, so that idle connections cost nothing.
    const bool pending = c.outSent < c.out.size();
    if (pending != c.wantsOut && !c.closing) {
      epoll_event event{};
      event.events = EPOLLIN | (pending ? EPOLLOUT : 0u);
      event.data.u64 = c.id;
      ::epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &event);
      c.wantsOut = pending;
    }
    if (!pending) {
      // Everything went out: the buffer starts again at its beginning (and a big reply's
      // buffer is given back), so the next reply is sent from offset 0.
      c.out.clear();
      c.outSent = 0;
      if (c.out.capacity() > (size_t{1} << 20)) Bytes().swap(c.out);
    }
  }

  TcpStoreServerOptions options_;
  std::vector<int> listeners_;
  uint16_t port_ = 0;
  int epoll_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> requests_{0}, bytesReceived_{0}, bytesSent_{0}, accepted_{0};
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t lastId_ = 0;
  uint64_t lastSerial_ = 0;
  std::unordered_map<std::string, Bytes> values_;
  size_t storedBytes_ = 0;
  /// Requests parked on each key (some stale); looked at when the key is written.
  std::unordered_map<std::string, std::vector<ParkedRef>> waiters_;
  /// Arrivals parked on each barrier counter, by the count that opens them.
  std::unordered_map<std::string, std::multimap<int64_t, ParkedRef>> arrivals_;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> expiries_;
  /// Connections with requests buffered behind one just answered.
  std::vector<uint64_t> resumable_;
  /// Connections to close at the end of this round.
  std::vector<uint64_t> dropped_;
  /// A host store's way to the root; null for a root store.
  std::unique_ptr<detail::HostStoreUplink> uplink_;
  struct Delivered {
    uint64_t connection;
    uint64_t serial;
    Bytes frame;
  };
  std::mutex deliveredMutex_;
  std::vector<Delivered> delivered_;
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
