// A loopback TCP port that stays this test's for as long as the object lives, for a server
// that must be told its port in advance (a launcher's --store, MASTER_PORT). The port is
// bound with SO_REUSEADDR and never listened on: the kernel hands it to no one binding
// port 0, a server that also sets SO_REUSEADDR (kolo's store does) binds and listens on it,
// and until then a client's connect is refused, so it retries.
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
