// The launcher's side of hang diagnosis: watching every local rank's flight-recorder ring
// for progress (--stall-seconds), asking the ranks for their dumps (SIGUSR1), writing the
// dump of a rank that does not answer from its ring file (with what /proc says of the
// process: stopped, in uninterruptible sleep...), and the plain-words summary.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kolo::parallel::detail {

/// A local rank as the watch sees it.
struct WatchedRank {
  int globalRank = 0;
  pid_t pid = -1;
  bool running = false;
};

class DebugWatch {
 public:
  using Clock = std::chrono::steady_clock;
  /// `dir` is the job's debug directory (KOLO_DEBUG_DIR of its ranks); `stallSeconds` 0: no
  /// stall watch. Removes the dumps and rings of `ranks` left from an earlier job there.
  DebugWatch(std::string dir, double stallSeconds, const std::vector<int>& ranks);

  const std::string& dir() const { return dir_; }

  /// True (once) when no rank's ring moved for the stall period while some still run; while
  /// a running rank has not opened its ring yet, the period is at least 60 s.
  bool stalled(const std::vector<WatchedRank>& ranks);
  double stallSeconds() const { return stallSeconds_; }

  /// Sends SIGUSR1 to every running rank and notes which dumps to wait for.
  void requestDumps(const std::vector<WatchedRank>& ranks);
  /// True when every rank asked has written a new dump (or is no longer running).
  bool dumpsSettled(const std::vector<WatchedRank>& ranks) const;
  bool collecting() const { return collecting_; }

  /// Ends the collection: writes the dump of each rank that did not answer from its ring,
  /// then returns the diagnosis (kolo::observe::diagnoseHang), or one line saying why there
  /// is none.
  std::vector<std::string> finish(const std::vector<WatchedRank>& ranks, int worldSize, const std::string& reason);

 private:
  std::string dir_;
  double stallSeconds_;
  int64_t lastProgress_ = -2;
  Clock::time_point lastChange_;
  bool reported_ = false;
  bool collecting_ = false;
  std::map<int, std::filesystem::file_time_type> before_;  // dump times when asked; absent: none
};

/// What /proc/PID/stat says of a process, in words ("" when it is running or sleeping).
std::string processStateNote(pid_t pid);

}  // namespace kolo::parallel::detail
