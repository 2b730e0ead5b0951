// Starting `kolo run`'s ranks so that none outlives the launcher: each rank is forked and
// exec'd with the kernel's parent-death signal set (SIGKILL when the launcher dies), and a
// small guard process kills whatever is left in the ranks' process groups afterwards.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace kolo::parallel::detail {

/// A started rank: its pid (also its process group id) and the read ends of its stdout and
/// stderr pipes; or pid -1 and `error`, the errno that kept PROGRAM from starting.
struct SpawnedRank {
  pid_t pid = -1;
  int outFd = -1;
  int errFd = -1;
  int error = 0;
};

/// Starts argv[0] (looked up in the launcher's PATH as execvp does) with exactly `env`, in
/// a process group of its own, stdout and stderr on fresh pipes, SIGINT/SIGTERM/SIGCHLD/
/// SIGPIPE at their defaults and unblocked, the rest of the calling thread's signal mask
/// and CPU affinity inherited. The child asks the kernel for SIGKILL when the calling
/// thread ends (PR_SET_PDEATHSIG; it checks its parent afterwards, so a launcher that died
/// during the fork is noticed too): call it from the thread that waits for the job, and
/// keep that thread until every rank is reaped. Between fork and exec the child makes only
/// async-signal-safe system calls, so other threads of the launcher are no hazard. Returns
/// error ENOENT/EACCES/... when PROGRAM cannot be executed (the child is reaped then);
/// throws IoError when pipes or fork fail.
SpawnedRank spawnRank(const std::vector<std::string>& argv, const std::vector<std::string>& env);

/// A process that outlives the launcher just long enough to SIGKILL every process group it
/// was told about, unless the launcher released it first. The parent-death signal reaches
/// only the ranks themselves; programs a rank started (a shell's children, data loader
/// workers) stay in its group, and the guard stops them. The guard runs in its own process
/// group, ignores SIGINT, SIGTERM, SIGHUP and SIGPIPE, closes every inherited descriptor
/// but its pipe, and notices the launcher's death as end of file on that pipe.
class JobGuard {
 public:
  /// Forks the guard; it can watch up to `maxGroups` groups. Throws IoError when the pipe
  /// or fork fails.
  explicit JobGuard(int maxGroups);
  /// Closes the pipe: without release() the guard then kills every group it watches (the
  /// launcher is leaving ranks behind, e.g. after an exception). Reaps the guard.
  ~JobGuard();
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

  /// Adds a rank's process group; best effort (a dead guard is not an error).
  void watch(pid_t processGroup);
  /// The job ended with every rank reaped: the guard exits without killing anything.
  void release();
  /// The guard's pid (for tests and diagnostics).
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool released_ = false;
};

}  // namespace kolo::parallel::detail
