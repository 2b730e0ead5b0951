// The parameter-server connections: an owned socket that names its peer, over the comm
// layer's deadline-bounded calls (comm/socket.h), whose failures it raises as Timeout and
// PeerError.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace kolo::parallel::ps::detail {

using Clock = std::chrono::steady_clock;

/// One owned socket descriptor and the words that name its peer in error messages
/// ("parameter server 1 (127.0.0.1:40123)").
class Socket {
 public:
  Socket() = default;
  Socket(int fd, std::string peer);
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  const std::string& peer() const { return peer_; }
  void setPeer(std::string peer) { peer_ = std::move(peer); }
  void close();

  /// Sends every byte of the buffers in order. Throws PeerError naming the peer and `what`
  /// when the connection fails, Timeout when the peer does not take the bytes by `deadline`.
  void sendAll(const iovec* parts, int count, Clock::time_point deadline, const char* what);
  void sendAll(const void* data, size_t size, Clock::time_point deadline, const char* what);
  /// Receives exactly `size` bytes. PeerError when the peer closes the connection or it
  /// fails, Timeout at the deadline.
  void recvAll(void* data, size_t size, Clock::time_point deadline, const char* what);
  /// Waits until bytes (or the end of the stream) can be read: true, or false after
  /// `timeout`.
  bool waitReadable(std::chrono::milliseconds timeout) const;

 private:
  int fd_ = -1;
  std::string peer_;
};

/// A listening socket on host:port (port 0: a free one); `*bound` receives the port.
/// Throws IoError naming the address.
Socket listenOn(const std::string& host, uint16_t port, uint16_t* bound);
/// Accepts one connection, waiting at most `timeout`; an invalid Socket when none came.
Socket acceptFor(const Socket& listener, std::chrono::milliseconds timeout);
/// Connects to "host:port", retrying refused connections until `deadline` (the peer may
/// not listen yet). Throws PeerError naming `peer` when it cannot.
Socket connectTo(const std::string& address, Clock::time_point deadline, const std::string& peer);

/// True when bytes wait unread on socket descriptor `fd` (not at its end); does not wait.
bool bytesWaiting(int fd);

/// now + timeout, saturating.
Clock::time_point deadlineAfter(std::chrono::milliseconds timeout);

}  // namespace kolo::parallel::ps::detail
