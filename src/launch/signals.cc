// SignalScope: the launcher's signal handlers and the self-pipe they write to.
#include "launch/signals.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "kolo/error.h"

namespace kolo::parallel::detail {
namespace {

/// Write end of the self-pipe that SignalScope's handler reports signals through. Signal
/// handlers can reach nothing else, so this is the one piece of process-wide state the
/// launcher keeps; SignalScope sets it for its lifetime and refuses to nest.
std::atomic<int> signalPipeWrite{-1};

extern "C" void forwardSignalToPipe(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  int fd = signalPipeWrite.load();
  if (fd >= 0) {
    ssize_t written = ::write(fd, &byte, 1);  // a full pipe already says "a signal came"
    (void)written;
  }
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
    KOLO_THROW(IoError, "kolo run: cannot create the signal pipe: ", std::strerror(errno));
  int expected = -1;
  if (!signalPipeWrite.compare_exchange_strong(expected, pipe_[1])) {
    ::close(pipe_[0]);
    ::close(pipe_[1]);
    KOLO_THROW(InvalidArgument, "kolo run: a launcher is already running in this process");
  }
  struct sigaction action {};
  action.sa_handler = forwardSignalToPipe;
  sigemptyset(&action.sa_mask);
  // SA_NOCLDSTOP: a rank stopped by SIGSTOP is not an exit.
  for (size_t i = 0; i < kCaught.size(); ++i) {
    action.sa_flags = SA_RESTART | (kCaught[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kCaught[i], &action, &previous_[i]);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &previousPipe_);
  // Make sure none of them is blocked in this thread (the ranks inherit this mask too).
  sigset_t unblock;
  sigemptyset(&unblock);
  for (int sig : kCaught) sigaddset(&unblock, sig);
  pthread_sigmask(SIG_UNBLOCK, &unblock, &previousMask_);
}

SignalScope::~SignalScope() {
  pthread_sigmask(SIG_SETMASK, &previousMask_, nullptr);
  for (size_t i = 0; i < kCaught.size(); ++i) ::sigaction(kCaught[i], &previous_[i], nullptr);
  ::sigaction(SIGPIPE, &previousPipe_, nullptr);
  signalPipeWrite.store(-1);
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

}  // namespace kolo::parallel::detail
