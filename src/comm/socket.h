// TCP sockets for the store and the native transport: connecting, listening, whole reads
// and writes, and waits, each bounded by a deadline. Failures come back as values with the
// reason, because each caller names its own peer (a store's host:port, a rank) in the
// exception it throws and decides which kind it is.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kolo::comm::detail {

using SocketClock = std::chrono::steady_clock;

/// Waits until `fd` is ready for `events` (POLLIN, POLLOUT) or the deadline passes,
/// retrying interrupted waits. False at the deadline or when poll fails.
bool waitForSocket(int fd, short events, SocketClock::time_point deadline);

/// How a whole read or write ended.
struct Transfer {
  enum Status { Done, Closed, TimedOut, Failed };
  Status status = Done;
  int error = 0;  // errno, for Failed

  bool ok() const { return status == Done; }
  /// The other end went away: it closed the connection, reset it or stopped reading.
  bool peerGone() const;
  /// "the peer closed the connection", "timed out" or the system's text for `error`.
  std::string reason() const;
};

/// Sends all `bytes` before the deadline, waiting whenever the socket is full (a blocking
/// or non-blocking descriptor). Never raises SIGPIPE.
Transfer sendFully(int fd, const void* data, size_t bytes, SocketClock::time_point deadline);

/// Sends every byte of `count` buffers in order (one sendmsg per wake-up, so a header and
/// its payload leave together), with sendFully's waits and deadline.
Transfer sendFullyV(int fd, const iovec* parts, int count, SocketClock::time_point deadline);

/// Receives exactly `bytes` before the deadline; Closed when the peer closes first.
Transfer recvFully(int fd, void* data, size_t bytes, SocketClock::time_point deadline);

/// Connects to host:port, trying every address `host` resolves to in turn, each until the
/// sooner of the deadline and `perAddress` after its start. Returns a non-blocking,
/// close-on-exec descriptor, or -1 with the last reason in *error and, in *errorCode,
/// ECONNREFUSED when every address refused (nothing listens there), else another errno
/// (0 when the name did not resolve).
int connectTcp(const std::string& host, int port, SocketClock::time_point deadline, std::string* error,
               SocketClock::duration perAddress = SocketClock::duration::max(), int* errorCode = nullptr);

struct ListenOptions {
  /// Stop at the first address that listens (one socket), instead of one socket per
  /// address the host resolves to (IPv6 ones then IPv6-only, so IPv4 can share the port).
  bool firstOnly = false;
  /// SO_REUSEADDR, for a server that must get a port it was told in advance.
  bool reuseAddress = false;
  bool nonBlocking = false;
  /// Connections the kernel queues before accept (it caps this at net.core.somaxconn). A
  /// store that thousands of ranks connect to at once needs a deep queue: a full one drops
  /// connection attempts, which the clients retry only after a second.
  int backlog = 1024;
};

/// Listening sockets (backlog from the options, close-on-exec) on host:port. An empty host is every
/// interface: one dual-stack IPv6 socket, or IPv4 where IPv6 is off. With port 0 every
/// socket after the first takes the port the first got. Returns the descriptors, or none
/// with the reason in *error ("cannot resolve 'h': ..." or the last bind/listen error).
std::vector<int> listenTcp(const std::string& host, uint16_t port, const ListenOptions& options, std::string* error);

/// The local port `fd` is bound to (0 when it cannot be read).
uint16_t boundPort(int fd);

/// Numeric text of an IPv4 or IPv6 address, an IPv4-mapped IPv6 address as IPv4; "" for
/// other families.
std::string addressText(const sockaddr* address);

/// "host:port" of the other end of a connected socket ("[v6]:port" for IPv6), for messages;
/// "unknown peer" when the system cannot say.
std::string peerAddress(int fd);

/// Sends small messages at once (TCP_NODELAY).
void setNoDelay(int fd);

/// TCP_NODELAY and SO_KEEPALIVE: the store's connections, which idle between requests.
void setNoDelayAndKeepAlive(int fd);

}  // namespace kolo::comm::detail
