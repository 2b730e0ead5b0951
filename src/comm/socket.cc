// TCP sockets with deadlines (socket.h): the one place where the store and the native
// transport connect, listen, wait and move whole messages.
#include "comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "kolo/comm/stores.h"

namespace kolo::comm::detail {
namespace {

/// A wait that returned false: the deadline passed, or poll itself failed.
Transfer waitFailed(SocketClock::time_point deadline) {
  const int error = errno;
  if (SocketClock::now() >= deadline) return {Transfer::TimedOut, 0};
  return {Transfer::Failed, error};
}

/// Non-blocking connect to one resolved address until `limit`; -1 with the reason (and its
/// errno in *code, 0 for a timeout).
int connectOne(const addrinfo* a, SocketClock::time_point limit, std::string* error, int* code) {
  *code = 0;
  const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    *code = errno;
    *error = std::strerror(errno);
    return -1;
  }
  if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    *code = errno;
    *error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!waitForSocket(fd, POLLOUT, limit)) {
    *error = "connect timed out";
    ::close(fd);
    return -1;
  }
  int soError = 0;
  socklen_t len = sizeof soError;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len);
  if (soError != 0) {
    *code = soError;
    *error = std::strerror(soError);
    ::close(fd);
    return -1;
  }
  return fd;
}

void setPort(sockaddr* address, uint16_t port) {
  if (address->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(port);
  } else if (address->sa_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(port);
  }
}

}  // namespace

bool waitForSocket(int fd, short events, SocketClock::time_point deadline) {
  for (;;) {
    const auto now = SocketClock::now();
    if (now >= deadline) return false;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

bool Transfer::peerGone() const {
  return status == Closed ||
         (status == Failed && (error == ECONNRESET || error == EPIPE || error == ECONNABORTED));
}

std::string Transfer::reason() const {
  switch (status) {
    case Done: return "done";
    case Closed: return "the peer closed the connection";
    case TimedOut: return "timed out";
    case Failed: return std::strerror(error);
  }
  return "unknown";
}

Transfer sendFully(int fd, const void* data, size_t bytes, SocketClock::time_point deadline) {
  iovec part{const_cast<void*>(data), bytes};
  return sendFullyV(fd, &part, 1, deadline);
}

Transfer sendFullyV(int fd, const iovec* parts, int count, SocketClock::time_point deadline) {
  std::vector<iovec> left(parts, parts + count);
  size_t first = 0;
  while (first < left.size()) {
    if (left[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr message{};
    message.msg_iov = left.data() + first;
    message.msg_iovlen = std::min<size_t>(left.size() - first, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      // Drop what went out from the front.
      for (size_t sent = static_cast<size_t>(n); sent > 0;) {
        const size_t take = std::min(sent, left[first].iov_len);
        left[first].iov_base = static_cast<char*>(left[first].iov_base) + take;
        left[first].iov_len -= take;
        sent -= take;
        if (left[first].iov_len == 0) ++first;
      }
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitForSocket(fd, POLLOUT, deadline)) return waitFailed(deadline);
    } else {
      return {Transfer::Failed, n < 0 ? errno : EPIPE};
    }
  }
  return {};
}

Transfer recvFully(int fd, void* data, size_t bytes, SocketClock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::recv(fd, p + done, bytes - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      return {Transfer::Closed, 0};
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitForSocket(fd, POLLIN, deadline)) return waitFailed(deadline);
    } else {
      return {Transfer::Failed, errno};
    }
  }
  return {};
}

int connectTcp(const std::string& host, int port, SocketClock::time_point deadline, std::string* error,
               SocketClock::duration perAddress, int* errorCode) {
  int code = 0;
  if (errorCode == nullptr) errorCode = &code;
  *errorCode = 0;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) {
    *error = ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  bool refused = true;
  for (const addrinfo* a = list; a != nullptr && fd < 0; a = a->ai_next) {
    const auto now = SocketClock::now();
    const auto limit = perAddress < deadline - now ? now + perAddress : deadline;
    fd = connectOne(a, limit, error, errorCode);
    refused = refused && (fd >= 0 || *errorCode == ECONNREFUSED);
  }
  ::freeaddrinfo(list);
  if (fd < 0 && !refused) *errorCode = ETIMEDOUT;
  return fd;
}

std::vector<int> listenTcp(const std::string& host, uint16_t port, const ListenOptions& options, std::string* error) {
  std::vector<int> fds;
  auto listenOn = [&](sockaddr* address, socklen_t len, bool v6only) {
    if (!fds.empty()) setPort(address, boundPort(fds.front()));
    const int fd = ::socket(address->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = std::strerror(errno);
      return false;
    }
    const int on = 1;
    if (options.reuseAddress) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (address->sa_family == AF_INET6) {
      const int only = v6only ? 1 : 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof only);
    }
    if (::bind(fd, address, len) != 0 || ::listen(fd, options.backlog) != 0) {
      *error = std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (options.nonBlocking) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    fds.push_back(fd);
    return true;
  };
  if (host.empty()) {
    // One dual-stack IPv6 socket serves IPv4 too; IPv4 alone where IPv6 is off.
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(port);
    if (!listenOn(reinterpret_cast<sockaddr*>(&any6), sizeof any6, false)) {
      sockaddr_in any4{};
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(port);
      listenOn(reinterpret_cast<sockaddr*>(&any4), sizeof any4, false);
    }
    return fds;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) {
    *error = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return fds;
  }
  for (addrinfo* a = list; a != nullptr && !(options.firstOnly && !fds.empty()); a = a->ai_next)
    listenOn(a->ai_addr, a->ai_addrlen, !options.firstOnly);
  ::freeaddrinfo(list);
  return fds;
}

uint16_t boundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return 0;
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

std::string addressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (address->sa_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof text);
    }
  } else if (address->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof text);
  }
  return text;
}

std::string peerAddress(int fd) {
  sockaddr_storage address{};
  socklen_t len = sizeof address;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) return "unknown peer";
  const uint16_t port = ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                                            : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  return HostPort{addressText(reinterpret_cast<const sockaddr*>(&address)), port}.toString();
}

void setNoDelay(int fd) {
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

void setNoDelayAndKeepAlive(int fd) {
  setNoDelay(fd);
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
}

}  // namespace kolo::comm::detail
