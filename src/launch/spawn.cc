// spawnRank (fork + exec with a parent-death signal) and JobGuard (the process that kills
// the ranks' groups when the launcher dies). Code that runs in a forked child makes only
// async-signal-safe calls: the launcher may have other threads (the TCP store server)
// whose locks a forked child must never touch.
#include "launch/spawn.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "kolo/error.h"

namespace kolo::parallel::detail {
namespace {

/// PROGRAM as execvp finds it: a name with a slash as given, otherwise the first regular,
/// executable file of that name in PATH (default "/bin:/usr/bin"). Returns 0 or the errno
/// execvp would report (ENOENT, or EACCES when only non-executable candidates exist).
int findProgram(const std::string& name, std::string* path) {
  if (name.empty()) return ENOENT;
  if (name.find('/') != std::string::npos) {
    *path = name;
    return 0;
  }
  const char* searchPath = std::getenv("PATH");
  const std::string dirs = searchPath ? searchPath : "/bin:/usr/bin";
  int error = ENOENT;
  size_t begin = 0;
  for (;;) {
    const size_t end = dirs.find(':', begin);
    std::string dir =
        dirs.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      if (::access(candidate.c_str(), X_OK) == 0) {
        *path = std::move(candidate);
        return 0;
      }
      error = EACCES;
    }
    if (end == std::string::npos) return error;
    begin = end + 1;
  }
}

/// Moves `fd` above the standard descriptors (a launcher started with 0, 1 or 2 closed
/// gets pipe ends there, which the dup2 onto 1 and 2 would clobber). Async-signal-safe.
int aboveStandard(int fd) {
  return fd > STDERR_FILENO ? fd : ::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
}

/// The forked rank until exec; never returns. On failure the errno goes to the launcher
/// through `report` (close-on-exec: end of file there means exec succeeded).
[[noreturn]] void rankChild(const char* path, char* const* argv, char* const* envp, int outWrite,
                            int errWrite, int report, pid_t launcher, const sigset_t& rankMask) {
  report = aboveStandard(report);
  auto fail = [report](int error) {
    [[maybe_unused]] ssize_t n = ::write(report, &error, sizeof error);
    ::_exit(127);
  };
  // Signals the launcher catches or ignores start at their defaults; all signals stay
  // blocked (the launcher blocked them around fork) until the final mask is set below.
  struct sigaction defaults {};
  defaults.sa_handler = SIG_DFL;
  sigemptyset(&defaults.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(sig, &defaults, nullptr);
  // Own process group: the launcher signals the rank's whole tree with kill(-pgid), and a
  // terminal's Ctrl-C reaches only the launcher, which forwards it.
  if (::setpgid(0, 0) != 0) fail(errno);
  // Die with the launcher. The launcher may already have died between fork and prctl; then
  // this process has been re-parented and no signal will come, so check.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(errno);
  if (::getppid() != launcher) ::_exit(127);
  outWrite = aboveStandard(outWrite);
  errWrite = aboveStandard(errWrite);
  if (outWrite < 0 || errWrite < 0) fail(errno);
  if (::dup2(outWrite, STDOUT_FILENO) < 0 || ::dup2(errWrite, STDERR_FILENO) < 0) fail(errno);
  ::sigprocmask(SIG_SETMASK, &rankMask, nullptr);
  ::execve(path, argv, envp);
  fail(errno);
  ::_exit(127);  // not reached
}

/// Closes every descriptor except `keep` (close_range where the kernel has it).
void closeAllBut(int keep) {
#ifdef SYS_close_range
  if ((keep == 0 || ::syscall(SYS_close_range, 0u, static_cast<unsigned>(keep - 1), 0u) == 0) &&
      ::syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0u, 0u) == 0)
    return;
#endif
  for (int fd = 0; fd < 65536; ++fd)
    if (fd != keep) ::close(fd);
}

/// The guard process; never returns. Reads process-group ids (pid_t each, 0 = released)
/// until end of file, then SIGKILLs every group it was given.
[[noreturn]] void guardChild(int readFd, pid_t* groups, int capacity) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) ::sigaction(sig, &ignore, nullptr);
  struct sigaction defaults {};
  defaults.sa_handler = SIG_DFL;
  sigemptyset(&defaults.sa_mask);
  ::sigaction(SIGCHLD, &defaults, nullptr);
  // Out of the launcher's group: a signal sent to that group (a terminal's hang-up) must
  // not take the guard along with the launcher.
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "kolo-run-guard");  // what ps and top show for it
  closeAllBut(readFd);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int count = 0;
  unsigned char message[sizeof(pid_t)];
  size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(readFd, message + have, sizeof message - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the launcher is gone (or closed the pipe without releasing us)
    have += static_cast<size_t>(n);
    if (have < sizeof message) continue;
    have = 0;
    pid_t group = 0;
    std::memcpy(&group, message, sizeof group);
    if (group == 0) ::_exit(0);
    if (group > 0 && count < capacity) groups[count++] = group;
  }
  for (int i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

void closeBoth(int fds[2]) {
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace

SpawnedRank spawnRank(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  KOLO_CHECK(!argv.empty(), "spawnRank: no program");
  SpawnedRank result;
  std::string path;
  if (int error = findProgram(argv[0], &path); error != 0) {
    result.error = error;
    return result;
  }
  // Everything the child needs is built before fork: it must not allocate.
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int outPipe[2], errPipe[2], report[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0)
    KOLO_THROW(IoError, "kolo run: pipe failed: ", std::strerror(errno));
  if (::pipe2(errPipe, O_CLOEXEC) != 0) {
    const int e = errno;
    closeBoth(outPipe);
    KOLO_THROW(IoError, "kolo run: pipe failed: ", std::strerror(e));
  }
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const int e = errno;
    closeBoth(outPipe);
    closeBoth(errPipe);
    KOLO_THROW(IoError, "kolo run: pipe failed: ", std::strerror(e));
  }
  // Block every signal across fork, so the launcher's handlers (which write to its signal
  // pipe) never run in the child; the child sets its own mask just before exec.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  sigset_t rankMask = previous;
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) sigdelset(&rankMask, sig);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0)
    rankChild(path.c_str(), args.data(), envp.data(), outPipe[1], errPipe[1], report[1], launcher,
              rankMask);
  const int forkError = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(outPipe[1]);
  ::close(errPipe[1]);
  ::close(report[1]);
  if (pid < 0) {
    ::close(outPipe[0]);
    ::close(errPipe[0]);
    ::close(report[0]);
    KOLO_THROW(IoError, "kolo run: fork failed: ", std::strerror(forkError));
  }
  // End of file: exec succeeded. An int: the child's errno, and it has exited.
  int childError = 0;
  size_t got = 0;
  while (got < sizeof childError) {
    const ssize_t n =
        ::read(report[0], reinterpret_cast<char*>(&childError) + got, sizeof childError - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(report[0]);
  if (got == sizeof childError) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    ::close(outPipe[0]);
    ::close(errPipe[0]);
    result.error = childError != 0 ? childError : EIO;
    return result;
  }
  result.pid = pid;
  result.outFd = outPipe[0];
  result.errFd = errPipe[0];
  return result;
}

JobGuard::JobGuard(int maxGroups) {
  KOLO_CHECK(maxGroups >= 0, "JobGuard: negative group count ", maxGroups);
  // The guard's list lives in memory allocated here, before fork: the child must not allocate.
  std::vector<pid_t> groups(static_cast<size_t>(maxGroups) + 1);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    KOLO_THROW(IoError, "kolo run: pipe for the guard process failed: ", std::strerror(errno));
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[1]);
    guardChild(fds[0], groups.data(), maxGroups);
  }
  const int forkError = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    KOLO_THROW(IoError, "kolo run: fork of the guard process failed: ", std::strerror(forkError));
  }
  pid_ = pid;
  fd_ = fds[1];
}

JobGuard::~JobGuard() {
  ::close(fd_);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void JobGuard::watch(pid_t processGroup) {
  if (released_ || processGroup <= 0) return;
  // One write of 4 bytes is atomic on a pipe; a guard that died gives EPIPE (SIGPIPE is
  // ignored by the launcher), which is ignored here.
  [[maybe_unused]] ssize_t n = ::write(fd_, &processGroup, sizeof processGroup);
}

void JobGuard::release() {
  if (released_) return;
  released_ = true;
  const pid_t done = 0;
  [[maybe_unused]] ssize_t n = ::write(fd_, &done, sizeof done);
}

}  // namespace kolo::parallel::detail
