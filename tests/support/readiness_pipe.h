// A pipe that forked children use to tell the parent they have reached a point (the
// communicator is built, a collective is about to start), so that the parent acts (kills,
// stops) on a known state instead of after a guessed sleep.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kolo/error.h"

namespace kolo::testing {

/// Create it before forking. Each child calls signal() once (or exits); the parent calls
/// awaitSignals(n) after forking them all. A child that ends without signalling closes its
/// end by exiting, so the parent never waits for ever: once every child has signalled or
/// exited, awaitSignals returns.
class ReadinessPipe {
 public:
  ReadinessPipe() {
    if (::pipe2(fds_, O_CLOEXEC) != 0) KOLO_THROW(IoError, "readiness pipe: ", std::strerror(errno));
  }
  ~ReadinessPipe() {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  ReadinessPipe(const ReadinessPipe&) = delete;
  ReadinessPipe& operator=(const ReadinessPipe&) = delete;

  /// In a child: one byte to the parent, then this child's write end is closed (a child that
  /// then blocks or stops holds nothing the parent waits on).
  void signal() {
    const char ready = 1;
    ssize_t n;
    do n = ::write(fds_[1], &ready, 1);
    while (n < 0 && errno == EINTR);
    ::close(fds_[1]);
    fds_[1] = -1;
  }

  /// In the parent: closes its own write end, then reads until `count` signals arrived or
  /// every child's end is closed; returns the number of signals read.
  int awaitSignals(int count) {
    if (fds_[1] >= 0) {
      ::close(fds_[1]);
      fds_[1] = -1;
    }
    int got = 0;
    while (got < count) {
      char bytes[64];
      ssize_t n = ::read(fds_[0], bytes, sizeof bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<int>(n);
    }
    return got;
  }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace kolo::testing
