// The TCP store client: one connection per client object, requests serialised under a
// mutex, every socket wait bounded by a deadline. A server that closes the connection or
// stops answering turns into IoError, and the connection is not used again.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "comm/store/store_detail.h"
#include "comm/store/tcp_wire.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {

using Clock = std::chrono::steady_clock;
using detail::StoreOp;
using detail::StoreStatus;
using detail::WireWriter;

std::string HostPort::toString() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

HostPort parseHostPort(const std::string& text) {
  HostPort result;
  std::string portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      KOLO_THROW(InvalidArgument, "address '", text, "' is not [IPV6]:PORT");
    result.host = text.substr(1, close - 1);
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      KOLO_THROW(InvalidArgument, "address '", text,
                 "' is not HOST:PORT (write IPv6 as [ADDR]:PORT)");
    result.host = text.substr(0, colon);
    portText = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
  if (result.host.empty() || ec != std::errc() || ptr != portText.data() + portText.size() ||
      port > 65535)
    KOLO_THROW(InvalidArgument, "address '", text, "': bad host or port '", portText, "'");
  result.port = static_cast<uint16_t>(port);
  return result;
}

namespace {

int remainingMs(Clock::time_point deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

/// Non-blocking connect to one address, waiting until the deadline; -1 on failure.
int connectOne(const addrinfo* a, Clock::time_point deadline, std::string* error) {
  int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *error = std::strerror(errno);
      ::close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int rc = ::poll(&p, 1, remainingMs(deadline));
    int soError = 0;
    socklen_t len = sizeof soError;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len);
    if (rc <= 0 || soError != 0) {
      *error = rc == 0 ? "connect timed out" : std::strerror(soError ? soError : errno);
      ::close(fd);
      return -1;
    }
  }
  int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  return fd;
}

/// Sends all of `data` before the deadline; false on error, closure or timeout.
bool sendAll(int fd, const uint8_t* data, size_t size, Clock::time_point deadline,
             std::string* error) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, remainingMs(deadline)) <= 0) {
        *error = "send timed out";
        return false;
      }
      continue;
    }
    *error = std::strerror(errno);
    return false;
  }
  return true;
}

/// Receives exactly `size` bytes before the deadline; false on error, closure or timeout.
bool recvAll(int fd, uint8_t* data, size_t size, Clock::time_point deadline, std::string* error) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      *error = "the server closed the connection";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLIN, 0};
      int rc = ::poll(&p, 1, remainingMs(deadline));
      if (rc == 0) {
        *error = "no reply before the deadline";
        return false;
      }
      continue;
    }
    *error = std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace

TcpStoreClient::TcpStoreClient(const TcpStoreClientOptions& options) : options_(options) {
  auto deadline = detail::deadlineAfter(options_.connectTimeout);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string lastError = "no address";
  auto pause = std::chrono::milliseconds(10);
  // The server may not be listening yet (rank 0 starts it): retry until the deadline.
  while (fd_ < 0) {
    addrinfo* list = nullptr;
    int rc =
        ::getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(), &hints, &list);
    if (rc != 0) {
      lastError = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = list; a && fd_ < 0; a = a->ai_next)
        fd_ = connectOne(a, deadline, &lastError);
      ::freeaddrinfo(list);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      KOLO_THROW(IoError, "TCP store: cannot connect to ", serverAddress(), " within ",
                 options_.connectTimeout.count(), " ms: ", lastError);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  Bytes hello = WireWriter()
                    .u8(static_cast<uint8_t>(StoreOp::Hello))
                    .u32(detail::kTcpStoreMagic)
                    .u8(detail::kTcpStoreVersion)
                    .str(options_.token)
                    .finish();
  try {
    Bytes reply = roundTrip(hello, detail::deadlineAfter(options_.requestTimeout));
    bool accepted = false;
    try {
      accepted = detail::parseStoreReply(StoreOp::Hello, reply.data(), reply.size()).status ==
                 StoreStatus::Ok;
    } catch (const FormatError&) {
    }
    if (!accepted)
      KOLO_THROW(IoError, "TCP store at ", serverAddress(), " did not accept the connection");
  } catch (const IoError& e) {
    ::close(fd_);
    fd_ = -1;
    KOLO_THROW(IoError, "TCP store at ", serverAddress(),
               " refused this client (wrong job token?): ", e.what());
  }
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::serverAddress() const {
  return HostPort{options_.host, options_.port}.toString();
}

std::string TcpStoreClient::localAddress() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof text);
    }
  } else {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  }
  return text;
}

Bytes TcpStoreClient::roundTrip(const Bytes& request, Clock::time_point replyDeadline) {
  std::lock_guard lock(mutex_);
  if (broken_ || fd_ < 0)
    KOLO_THROW(IoError, "TCP store at ", serverAddress(),
               ": the connection failed earlier and is closed");
  std::string error;
  uint32_t length = 0;
  Bytes reply;
  bool ok = sendAll(fd_, request.data(), request.size(), replyDeadline, &error) &&
            recvAll(fd_, reinterpret_cast<uint8_t*>(&length), 4, replyDeadline, &error);
  if (ok) {
    // The server's bytes are checked like anyone's: the length before the allocation.
    if (length == 0 || length > kMaxStoreValueBytes + 64) {
      ok = false;
      error = "malformed reply of length " + std::to_string(length);
    } else {
      reply.resize(length);
      ok = recvAll(fd_, reply.data(), length, replyDeadline, &error);
    }
  }
  if (!ok) {
    broken_ = true;
    KOLO_THROW(IoError, "TCP store at ", serverAddress(), ": ", error);
  }
  return reply;
}

std::chrono::steady_clock::time_point TcpStoreClient::replyDeadline(Millis timeout) const {
  // The server answers Timeout at the deadline; the extra requestTimeout covers transit,
  // past which the server counts as gone.
  Millis grace = options_.requestTimeout;
  Millis total =
      timeout > Millis::max() - grace ? Millis::max() : std::max(timeout, Millis(0)) + grace;
  return detail::deadlineAfter(total);
}

namespace {

/// Parses the reply to an `op` request; malformed replies become FormatError and Error
/// replies InvalidArgument, both naming the server.
detail::StoreReply readReply(StoreOp op, const Bytes& reply, const std::string& server) {
  detail::StoreReply parsed;
  try {
    parsed = detail::parseStoreReply(op, reply.data(), reply.size());
  } catch (const FormatError& e) {
    KOLO_THROW(FormatError, "TCP store at ", server, ": malformed reply: ", e.what());
  }
  if (parsed.status == StoreStatus::Error)
    KOLO_THROW(InvalidArgument, "TCP store at ", server, ": ", parsed.message);
  return parsed;
}

}  // namespace

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  detail::checkStoreKey(key);
  detail::checkStoreValue(key, value);
  Bytes request =
      WireWriter().u8(static_cast<uint8_t>(StoreOp::Set)).str(key).bytes(value).finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  readReply(StoreOp::Set, reply, serverAddress());
}

Bytes TcpStoreClient::get(const std::string& key, Millis timeout) {
  detail::checkStoreKey(key);
  Bytes request = WireWriter()
                      .u8(static_cast<uint8_t>(StoreOp::Get))
                      .str(key)
                      .u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)))
                      .finish();
  Bytes reply = roundTrip(request, replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::Get, reply, serverAddress());
  if (parsed.status == StoreStatus::Timeout)
    detail::throwStoreTimeout("TCP get at " + serverAddress(), {key}, timeout);
  return std::move(parsed.value);
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, Millis timeout) {
  WireWriter writer;
  writer.u8(static_cast<uint8_t>(StoreOp::Wait)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    detail::checkStoreKey(key);
    writer.str(key);
  }
  writer.u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  Bytes reply = roundTrip(writer.finish(), replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::Wait, reply, serverAddress());
  if (parsed.status == StoreStatus::Timeout)
    detail::throwStoreTimeout("TCP wait at " + serverAddress(), parsed.missing, timeout);
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  detail::checkStoreKey(key);
  Bytes request = WireWriter()
                      .u8(static_cast<uint8_t>(StoreOp::Add))
                      .str(key)
                      .u64(static_cast<uint64_t>(delta))
                      .finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  return readReply(StoreOp::Add, reply, serverAddress()).counter;
}

bool TcpStoreClient::remove(const std::string& key) {
  detail::checkStoreKey(key);
  Bytes request = WireWriter().u8(static_cast<uint8_t>(StoreOp::Remove)).str(key).finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  return readReply(StoreOp::Remove, reply, serverAddress()).flag;
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  WireWriter writer;
  writer.u8(static_cast<uint8_t>(StoreOp::Check)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    detail::checkStoreKey(key);
    writer.str(key);
  }
  Bytes reply = roundTrip(writer.finish(), detail::deadlineAfter(options_.requestTimeout));
  return readReply(StoreOp::Check, reply, serverAddress()).flag;
}

std::shared_ptr<Store> connectTcpStore(const std::string& address, const std::string& token,
                                       std::chrono::milliseconds timeout) {
  HostPort hp = parseHostPort(address);
  TcpStoreClientOptions options;
  options.host = hp.host;
  options.port = hp.port;
  options.token = token;
  options.connectTimeout = timeout;
  options.requestTimeout = timeout;
  return std::make_shared<TcpStoreClient>(options);
}

}  // namespace kolo::comm
