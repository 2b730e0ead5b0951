// The job's membership and fault events as `kolo run` sees them (--events FILE): its start,
// every rank that ended in failure (killed by a signal, from outside or by kolo run stopping
// the job, or exiting with an error), and its end, as JSON lines of the metrics format
// ("kind":"event") that `kolo report` reads beside a run's metrics.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "kolo/observe.h"

namespace kolo::parallel::detail {

class JobEvents {
 public:
  /// Appends to `path` (created when missing; throws IoError naming it when it cannot be
  /// opened). An empty path records nothing.
  explicit JobEvents(const std::string& path);

  /// The ranks were started: `ranks` in the job, `localRanks` on this node.
  void started(int ranks, int localRanks, int firstRank);
  /// Rank `rank` ended with wait status `status` other than a clean exit. `stopping`: kolo
  /// run had begun stopping the job (its SIGTERM or SIGKILL, or a rank that ended meanwhile);
  /// `role`: a parameter-server job's role, or empty.
  void rankFailed(int rank, pid_t pid, int status, bool stopping, const std::string& role);
  /// The job ended with `exitCode`; `failure` says why when it failed.
  void ended(int exitCode, const std::string& failure);

 private:
  void write(observe::Fields fields);

  std::unique_ptr<observe::MetricsWriter> writer_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace kolo::parallel::detail
