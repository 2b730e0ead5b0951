// Signal handling for the `kolo run` launcher: SIGINT, SIGTERM and SIGCHLD are caught for
// the launcher's lifetime and reported through a pipe its poll loop reads.
#pragma once

#include <signal.h>

#include <array>

namespace kolo::parallel::detail {

/// Catches SIGINT, SIGTERM and SIGCHLD for the scope and reports them through a pipe the
/// job's poll loop reads (handlers rather than a signalfd, because threads that libraries
/// started earlier do not block signals, and a process-directed signal may land on them).
/// SIGPIPE is ignored so a closed stdout gives EPIPE. Everything is restored afterwards.
/// One scope per process at a time: a second throws InvalidArgument.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  /// Readable when a signal arrived; each byte is a signal number.
  int fd() const { return pipe_[0]; }

 private:
  static constexpr std::array<int, 3> kCaught = {SIGINT, SIGTERM, SIGCHLD};
  int pipe_[2] = {-1, -1};
  std::array<struct sigaction, 3> previous_{};
  struct sigaction previousPipe_ {};
  sigset_t previousMask_;
};

}  // namespace kolo::parallel::detail
