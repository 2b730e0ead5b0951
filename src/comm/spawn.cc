// comm::spawn: forked local ranks over a file store in a private directory. Each rank tells
// how it ended through a pipe of its own; the parent waits on the ranks' pidfds (so it reaps
// its ranks and never another child of the process) and stops the rest at the first failure.
#include "kolo/comm/spawn.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <typeinfo>

#include "comm/affinity.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace {

// A rank's report, written in one write() of at most PIPE_BUF bytes just before it exits
// (atomic, and never blocking on the empty pipe): "R<value>" when its function returned, or
// "E<p><type>\n<message>" when it threw, p being 'P' for a PeerError and '-' otherwise; the
// message is cut to fit.
constexpr size_t kMaxReportBytes = PIPE_BUF;

std::string typeName(const std::exception& e) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : typeid(e).name();
  std::free(demangled);
  return name;
}

void flushOutput() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

// A forked rank: never returns, never throws.
[[noreturn]] void runRank(int rank, int ranks, int cpu, const RankFunction& fn,
                          const SpawnOptions& options, const std::string& storeDir, pid_t parent,
                          int reportFd) {
  // Die with the parent; a parent that died during the fork is noticed here.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  // The parent stops ranks with SIGTERM, whatever it does with the signal itself.
  signal(SIGTERM, SIG_DFL);
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &term, nullptr);

  std::string report;
  try {
    if (cpu >= 0) bindThisThread(cpu);
    report = "R" + std::to_string(fn(createNativeCommunicator(makeFileStore(storeDir), rank, ranks,
                                                              options.native)));
  } catch (const std::exception& e) {
    report = std::string("E") + (dynamic_cast<const PeerError*>(&e) != nullptr ? 'P' : '-') +
             typeName(e) + "\n" + e.what();
  } catch (...) {
    report = "E-an exception that is not a std::exception\n";
  }
  flushOutput();
  report.resize(std::min(report.size(), kMaxReportBytes));
  const bool written =
      write(reportFd, report.data(), report.size()) == static_cast<ssize_t>(report.size());
  _exit(written && report[0] == 'R' ? 0 : 1);
}

struct Rank {
  pid_t pid = -1;
  int pidfd = -1;
  int reportFd = -1;  // the read end of the rank's pipe
  bool running = false;
};

/// How one rank ended.
struct Outcome {
  int value = 0;
  bool failed = false;
  /// A PeerError in the rank: most likely the consequence of another rank's failure.
  bool peerError = false;
  /// For a failure: "rank R of N ..." and a short form for lists.
  std::string what;
  std::string brief;
};

std::string readReport(int fd) {
  std::string report;
  char buffer[kMaxReportBytes];
  for (;;) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got > 0) {
      report.append(buffer, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return report;  // end of file, or nothing more (EAGAIN: a process the rank started holds the
                    // pipe)
  }
}

Outcome outcomeOf(int rank, int ranks, const std::string& report, bool reaped, int status,
                  bool stopped) {
  Outcome o;
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(ranks);
  if (!report.empty() && report[0] == 'R') {
    o.value = std::atoi(report.c_str() + 1);
    return o;
  }
  o.failed = true;
  if (report.size() >= 2 && report[0] == 'E') {
    const size_t newline = report.find('\n');
    const std::string type =
        report.substr(2, newline == std::string::npos ? std::string::npos : newline - 2);
    const std::string message = newline == std::string::npos ? "" : report.substr(newline + 1);
    o.peerError = report[1] == 'P';
    o.what = who + " failed: " + type + ": " + message;
    o.brief = "rank " + std::to_string(rank) + " (" + type + ")";
  } else if (!reaped) {
    o.what = who + " ended without saying how (its exit status is lost: is SIGCHLD ignored?)";
    o.brief = "rank " + std::to_string(rank);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (stopped && sig == SIGTERM) return {};  // stopped by spawn after another rank failed
    const char* abbrev = sigabbrev_np(sig);
    const std::string name = abbrev != nullptr ? std::string("SIG") + abbrev : "unknown";
    o.what = who + " died of signal " + std::to_string(sig) + " (" + name + ")";
    o.brief = "rank " + std::to_string(rank) + " (" + name + ")";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return {};  // ended its process with status 0: as if its function returned 0
  } else {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    o.what = who + " exited with status " + std::to_string(code) + " before its function returned";
    o.brief = "rank " + std::to_string(rank) + " (status " + std::to_string(code) + ")";
  }
  return o;
}

constexpr std::string_view kStorePrefix = "kolo-spawn-";

/// Removes the store directories ("kolo-spawn-<pid>-XXXXXX") in `tmp` of callers that no
/// longer exist: a caller killed by SIGKILL never runs its cleanup (its ranks die with it), so
/// the next call, in any process, takes the directory away. A directory of a live process, of
/// a pid now used by another process or of another user stays.
void removeStaleStoreDirectories(const std::filesystem::path& tmp) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kStorePrefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + kStorePrefix.size(), &end, 10);
    if (pid <= 0 || *end != '-' || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::filesystem::remove_all(entry.path(), ec);
  }
}

/// The ranks of one call and their store directory. Ranks still running when it goes (the
/// parent failed half-way) are killed and reaped; the directory is removed.
class LocalJob {
 public:
  explicit LocalJob(int ranks) : ranks_(static_cast<size_t>(ranks)) {
    const std::filesystem::path tmp = std::filesystem::temp_directory_path();
    removeStaleStoreDirectories(tmp);
    std::string pattern =
        (tmp / (std::string(kStorePrefix) + std::to_string(getpid()) + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      KOLO_THROW(IoError, "comm::spawn: cannot create a store directory from ", pattern, ": ",
                 std::strerror(errno));
    }
    storeDir_ = pattern;
  }

  ~LocalJob() {
    for (Rank& r : ranks_) {
      if (r.running) {
        kill(r.pid, SIGKILL);
        while (waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      if (r.pidfd >= 0) close(r.pidfd);
      if (r.reportFd >= 0) close(r.reportFd);
    }
    std::error_code ignored;
    std::filesystem::remove_all(storeDir_, ignored);
  }

  LocalJob(const LocalJob&) = delete;
  LocalJob& operator=(const LocalJob&) = delete;

  void start(const RankFunction& fn, const SpawnOptions& options) {
    const int n = static_cast<int>(ranks_.size());
    const CpuBinding bind = n > 1 ? options.bind : CpuBinding::None;
    const std::vector<int> cpus = bind == CpuBinding::None ? std::vector<int>{} : allowedCpus();
    const pid_t parent = getpid();
    flushOutput();
    for (int r = 0; r < n; ++r) {
      int pipeFds[2];
      if (pipe2(pipeFds, O_CLOEXEC) != 0) {
        KOLO_THROW(IoError, "comm::spawn: cannot make the pipe of rank ", r, ": ",
                   std::strerror(errno));
      }
      const pid_t pid = fork();
      if (pid == 0) {
        close(pipeFds[0]);
        for (int earlier = 0; earlier < r; ++earlier) {
          close(ranks_[earlier].pidfd);
          close(ranks_[earlier].reportFd);
        }
        runRank(r, n, cpuForLocalRank(bind, r, cpus), fn, options, storeDir_, parent, pipeFds[1]);
      }
      const int forkErrno = errno;
      close(pipeFds[1]);
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.reportFd = pipeFds[0];
      if (pid < 0)
        KOLO_THROW(IoError, "comm::spawn: fork of rank ", r, " failed: ", std::strerror(forkErrno));
      rank.pid = pid;
      rank.running = true;
      fcntl(rank.reportFd, F_SETFL, O_NONBLOCK);
      rank.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      if (rank.pidfd < 0) {
        KOLO_THROW(IoError, "comm::spawn: cannot watch rank ", r,
                   " (pidfd_open): ", std::strerror(errno));
      }
    }
  }

  /// Waits for every rank; the first failure stops the others (SIGTERM).
  std::vector<Outcome> wait() {
    std::vector<Outcome> outcomes(ranks_.size());
    bool stopping = false;
    for (;;) {
      std::vector<pollfd> watched;
      std::vector<size_t> which;
      for (size_t i = 0; i < ranks_.size(); ++i) {
        if (!ranks_[i].running) continue;
        watched.push_back({ranks_[i].pidfd, POLLIN, 0});
        which.push_back(i);
      }
      if (watched.empty()) return outcomes;
      if (poll(watched.data(), watched.size(), -1) < 0) {
        if (errno == EINTR) continue;
        KOLO_THROW(IoError, "comm::spawn: poll on the ranks failed: ", std::strerror(errno));
      }
      for (size_t k = 0; k < watched.size(); ++k) {
        if (watched[k].revents == 0) continue;
        const size_t i = which[k];
        Rank& rank = ranks_[i];
        int status = 0;
        pid_t got;
        while ((got = waitpid(rank.pid, &status, 0)) < 0 && errno == EINTR) {
        }
        rank.running = false;
        outcomes[i] = outcomeOf(static_cast<int>(i), static_cast<int>(ranks_.size()),
                                readReport(rank.reportFd), got == rank.pid, status, stopping);
        if (outcomes[i].failed) order_.push_back(i);
        if (outcomes[i].failed && !stopping) {
          stopping = true;
          for (const Rank& other : ranks_)
            if (other.running) kill(other.pid, SIGTERM);
        }
      }
    }
  }

  /// Ranks that failed, in the order they were reaped.
  const std::vector<size_t>& failures() const { return order_; }

 private:
  std::vector<Rank> ranks_;
  std::vector<size_t> order_;
  std::string storeDir_;
};

}  // namespace

std::vector<int> spawn(int ranks, const RankFunction& fn, const SpawnOptions& options) {
  KOLO_REQUIRE(ranks >= 1, "comm::spawn: ranks must be at least 1, got ", ranks);
  KOLO_REQUIRE(static_cast<bool>(fn), "comm::spawn: the rank function is empty");
  LocalJob job(ranks);
  job.start(fn, options);
  const std::vector<Outcome> outcomes = job.wait();
  const std::vector<size_t>& failed = job.failures();
  if (!failed.empty()) {
    // Name the first rank that failed for a reason of its own rather than one that lost a peer.
    auto first = std::find_if(failed.begin(), failed.end(),
                              [&](size_t i) { return !outcomes[i].peerError; });
    if (first == failed.end()) first = failed.begin();
    std::string others;
    for (size_t i : failed) {
      if (i == *first) continue;
      others += (others.empty() ? "; also failed: " : ", ") + outcomes[i].brief;
    }
    KOLO_THROW(PeerError, outcomes[*first].what, others);
  }
  std::vector<int> values;
  for (const Outcome& o : outcomes) values.push_back(o.value);
  return values;
}

}  // namespace kolo::comm
