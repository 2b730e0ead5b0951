// A loopback TCP port set aside for a server that must be told its port in advance (a
// launcher's --store, MASTER_PORT). The port is bound with SO_REUSEADDR and never listened
// on: the kernel hands it to no one binding port 0, a server that also sets SO_REUSEADDR
// (kolo's store does) binds and listens on it, and until then a client's connect is
// refused, so it retries. The reservation is not exclusive: see kReservedPortAttempts.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "kolo/error.h"

namespace kolo::testing {

/// How many reserved ports a test tries for one server started in another process. Until
/// the server listens, any process that binds the same port with SO_REUSEADDR and listens
/// first takes it, and the server fails with "Address already in use". The window cannot
/// be closed while the server must be told its port in advance (torchrun's rank 0 hosts
/// the store on MASTER_PORT), so such tests start the server alone, wait until it answers
/// (from then on the port is its own), and only on that error start it again on a fresh
/// reserved port.
inline constexpr int kReservedPortAttempts = 5;

/// True when a server's error output says another socket took its reserved port.
inline bool lostReservedPort(const std::string& errorOutput) {
  return errorOutput.find("Address already in use") != std::string::npos;
}

class ReservedPort {
 public:
  ReservedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) KOLO_THROW(IoError, "reserved port: socket: ", std::strerror(errno));
    int on = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd_);
      KOLO_THROW(IoError, "reserved port: bind 127.0.0.1:0: ", why);
    }
    port_ = ntohs(addr.sin_port);
  }
  ~ReservedPort() { ::close(fd_); }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  uint16_t port() const { return port_; }
  /// "127.0.0.1:PORT".
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

}  // namespace kolo::testing
