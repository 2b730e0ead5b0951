// The parameter-server sockets: an owned descriptor over the comm layer's deadline-bounded
// socket calls (comm/socket.h), turning their outcomes into Timeout and PeerError that name
// the peer.
#include "parallel/ps/socket.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "comm/socket.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::parallel::ps::detail {
namespace {

namespace cs = comm::detail;

/// Throws the error a failed transfer of `what` with `peer` deserves.
[[noreturn]] void transferFailed(const cs::Transfer& t, const std::string& peer, const char* what,
                                 bool sending) {
  if (t.status == cs::Transfer::TimedOut) {
    if (sending) KOLO_THROW(Timeout, peer, " did not take the bytes of ", what, " before the deadline");
    KOLO_THROW(Timeout, "no ", what, " from ", peer, " before the deadline");
  }
  if (t.status == cs::Transfer::Closed)
    KOLO_THROW(PeerError, peer, " closed the connection while this process waited for ", what);
  KOLO_THROW(PeerError, "lost the connection to ", peer, sending ? " while sending " : " while receiving ",
             what, ": ", t.reason());
}

}  // namespace

Clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
    return Clock::time_point::max();
  return now + timeout;
}

Socket::Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

Socket::~Socket() { close(); }

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_), peer_(std::move(other.peer_)) { other.fd_ = -1; }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    peer_ = std::move(other.peer_);
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::sendAll(const iovec* parts, int count, Clock::time_point deadline, const char* what) {
  const cs::Transfer t = cs::sendFullyV(fd_, parts, count, deadline);
  if (!t.ok()) transferFailed(t, peer_, what, true);
}

void Socket::sendAll(const void* data, size_t size, Clock::time_point deadline, const char* what) {
  const cs::Transfer t = cs::sendFully(fd_, data, size, deadline);
  if (!t.ok()) transferFailed(t, peer_, what, true);
}

void Socket::recvAll(void* data, size_t size, Clock::time_point deadline, const char* what) {
  const cs::Transfer t = cs::recvFully(fd_, data, size, deadline);
  if (!t.ok()) transferFailed(t, peer_, what, false);
}

bool Socket::waitReadable(std::chrono::milliseconds timeout) const {
  return cs::waitForSocket(fd_, POLLIN, deadlineAfter(timeout));
}

bool bytesWaiting(int fd) {
  int pending = 0;
  return ::ioctl(fd, FIONREAD, &pending) == 0 && pending > 0;
}

Socket listenOn(const std::string& host, uint16_t port, uint16_t* bound) {
  std::string error = "no address";
  cs::ListenOptions options;
  options.firstOnly = true;
  options.reuseAddress = true;
  options.nonBlocking = true;
  const std::vector<int> fds = cs::listenTcp(host, port, options, &error);
  if (fds.empty()) KOLO_THROW(IoError, "cannot listen on ", host, ":", port, ": ", error);
  *bound = cs::boundPort(fds.front());
  return Socket(fds.front(), "listener on " + host + ":" + std::to_string(*bound));
}

Socket acceptFor(const Socket& listener, std::chrono::milliseconds timeout) {
  if (!listener.waitReadable(timeout)) return {};
  const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return {};
  cs::setNoDelayAndKeepAlive(fd);
  return Socket(fd, "an unidentified peer");
}

Socket connectTo(const std::string& address, Clock::time_point deadline, const std::string& peer) {
  const comm::HostPort target = comm::parseHostPort(address);
  std::string error = "no address";
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    // The server may not listen yet: retry refused connections until the deadline.
    const int fd = cs::connectTcp(target.host, target.port, deadline, &error);
    if (fd >= 0) {
      cs::setNoDelayAndKeepAlive(fd);
      return Socket(fd, peer);
    }
    // No attempt right at the deadline: it would report "timed out" instead of the reason
    // the attempts failed (a server that is gone refuses).
    if (Clock::now() + pause >= deadline)
      KOLO_THROW(PeerError, "cannot connect to ", peer, " at ", address, ": ", error);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace kolo::parallel::ps::detail
