// The job of one `kolo run` launcher, private to src/launch: its ranks, its poll loop over
// their pipes and the signal pipe, and the policies for a rank that ends in failure
// (launcher.cc runs the job; loss_policy.cc decides what a failed rank means for it).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/elastic/store_keys.h"
#include "kolo/comm/stores.h"
#include "launch/debug.h"
#include "launch/events.h"
#include "launch/failure_watch.h"
#include "launch/launcher.h"
#include "launch/output.h"
#include "launch/signals.h"
#include "launch/spawn.h"

namespace kolo::parallel::detail {

using Clock = std::chrono::steady_clock;

/// Writes "kolo run: MESSAGE" to stderr in one write.
void say(const std::string& message);
/// "exited with status 3", "was killed by signal 9 (SIGKILL)".
std::string describeStatus(int status);
/// The launcher's exit status for a rank's wait status (128 + signal when killed).
int exitCodeFor(int status);

struct Rank {
  int globalRank = 0;
  std::string role;  // parameter-server jobs: "ps", "chief" or "worker"; else empty
  int roleIndex = 0;
  int localRank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int outFd = -1;
  int errFd = -1;
  bool killedAsLost = false;  // a parameter-server worker still running after the job
  bool joiner = false;        // --elastic: started in a lost rank's place
  std::unique_ptr<LinePrefixer> out;
  std::unique_ptr<LinePrefixer> err;
};

/// One launcher's job from the start of its ranks to their end (runLauncher()).
class Job {
 public:
  Job(const LauncherOptions& options, const SignalScope& signals)
      : options_(options), signals_(signals) {}

  ~Job();
  int run();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

 private:
  /// --debug-dir / KOLO_DEBUG_DIR, or a new directory when only --stall-seconds is given.
  void setUpDebugDirectory(int firstRank);
  std::vector<WatchedRank> watchedRanks() const;
  /// Stops the job; with a debug directory, first has every rank dump its flight recorder
  /// (the poll loop waits for the dumps, then prints the diagnosis and stops the ranks).
  void stopAfterDumps(const std::string& reason);
  void printDiagnosis();
  /// The poll loop's part of stopAfterDumps and of the stall watch.
  void watchDebug();
  /// KOLO_TIMELINE set for the job: node 0 merges the ranks' trace files once all ended.
  void mergeTimeline();
  /// Publishes this node's shape of the job (-n N, or --ps P --workers W) and checks that
  /// every node uses the same.
  void registerNode(std::chrono::milliseconds timeout);
  /// A node other than node 0: starts this host's store, which forwards to the root at
  /// `rootAddress` (kolo/comm/stores.h), and returns the address its ranks use. The root's
  /// address when this host's address towards the root is unknown; IoError when the host
  /// store cannot listen or reach the root.
  std::string startHostStore(const std::string& rootAddress, const std::string& token,
                             std::chrono::milliseconds timeout);
  /// --join: reads the running job's shape ("P W", published by its chief) from its store and
  /// takes the next worker index beyond W. Returns the global rank of the worker to start.
  int joinParameterServerJob(const std::string& storeAddress, const std::string& token,
                             std::chrono::milliseconds timeout);
  /// Parameter-server jobs: servers first, then the chief, then the workers (the order
  /// mpirun -np P+1+W gives them too).
  void assignRole(Rank& r) const;
  static std::string describeRank(const Rank& r);
  /// Says every started rank's pid, in one line.
  void sayPids() const;
  /// Starts rank r (its globalRank and localRank set) with the job's variables, KOLO_RANK,
  /// KOLO_LOCAL_RANK and `vars`, bound to its local rank's CPU. False (said why) when the
  /// program cannot be started.
  bool start(Rank& r, std::vector<std::pair<std::string, std::string>> vars);
  bool spawn(Rank& r, const std::vector<std::string>& env);
  /// --elastic: the most members a generation may have (--max-ranks, default -n × nodes()).
  int maxRanks() const;
  /// The nodes of the job: --nnodes M, or MAX of --nnodes MIN:MAX.
  int nodes() const;
  /// --elastic: starts a rank with a new launch rank in the place of each lost rank in
  /// replace_, while the job runs fewer than maxRanks() and has started fewer than
  /// maxRanks() replacements in all (a program that fails at once does not restart forever).
  void startReplacements();
  /// --elastic across nodes: a launcher sees only its own ranks, so it replaces a lost one
  /// while the job goes on and leaves --min-ranks to the ranks; once a member said the job
  /// is over (parallel::elasticFinishedKey), a rank's end is part of that. True (go on).
  bool loseElasticRankAcrossNodes(const Rank& r, const std::string& what);
  /// --elastic: how many running ranks are members of the job (a replacement counts once a
  /// generation admitted it).
  int runningMembers();
  bool anyRunning() const;
  /// Signals every rank's process group (also those whose leader has exited, so children
  /// they left behind are stopped too).
  void signalAll(int sig);
  void beginStop(int sig);
  void loop();
  static int remainingMs(Clock::time_point when);
  /// Reads what is available from one pipe; closes it at end of stream.
  void readPipe(Rank& r, bool isErr);
  /// Reads every pipe until it is empty (non-blocking) and writes out partial lines.
  void drainAll();
  void handleSignals();
  void reap();
  /// reap()'s last word on the rank to blame (`blamed`, of those reaped in this pass): one
  /// that exited with "another rank failed" (5) while others still run is held back for a
  /// moment, and a rank that ends meanwhile with a signal or an error of its own is blamed
  /// instead. Null: blame nobody yet.
  Rank* settleBlame(Rank* blamed);
  /// --elastic: marks the failed rank lost for the survivors. True when enough ranks are
  /// still running for the job to go on, or when too few are but they may still end by
  /// themselves: they see the failure, agree that they are below --min-ranks, write a
  /// checkpoint (with --checkpoint-dir) and exit with that error, so the launcher gives them
  /// three detection deadlines plus the grace period before it stops them
  /// (stopLateSurvivors). False (stop now) when none is left to write anything.
  bool loseElasticRank(const Rank& r);
  /// The poll loop's part of loseElasticRank: survivors still running at the deadline are
  /// stopped.
  void stopLateSurvivors();
  /// Parameter-server jobs: once the chief and the servers have finished, the workers still
  /// running are those the chief declared lost (a stopped or hung process); the others were
  /// told the job is over and end by themselves. After the grace period the launcher ends
  /// them with SIGKILL (which also ends a stopped process) and says so.
  void endLostWorkers();
  /// Tells the other nodes' launchers to stop (multi-node only); best effort.
  void publishFailure(const std::string& what);
  /// Multi-node and elastic jobs: watches the store for another node's failure
  /// (FailureWatch, its own connection to `storeAddress`).
  void watchRemoteFailure(const std::string& storeAddress, const std::string& token,
                          std::chrono::milliseconds timeout);
  /// The watch has news: another node's failure (or a lost store) stops this node's ranks.
  void checkRemoteFailure();
  /// Node 0 hosts the store, so it stays until every node has finished (or the
  /// rendezvous deadline passes); the other nodes only say that they have finished.
  void finishAcrossNodes(std::chrono::milliseconds timeout);

  const LauncherOptions& options_;
  const SignalScope& signals_;
  int psServers_ = 0;  // parameter-server jobs: P and W (read from the job's store with --join)
  int psWorkers_ = 0;
  int worldSize_ = 0;  // ranks of the whole job (KOLO_WORLD_SIZE)
  std::unique_ptr<JobGuard> guard_;
  std::unique_ptr<comm::TcpStoreServer> server_;
  /// Nodes other than node 0: the store this host's ranks use, in front of node 0's.
  std::unique_ptr<comm::TcpStoreServer> hostStore_;
  std::shared_ptr<comm::Store> store_;
  std::unique_ptr<FailureWatch> failureWatch_;  // while the ranks run (watchRemoteFailure)
  std::vector<Rank> ranks_;
  std::vector<std::pair<std::string, std::string>> vars_;  // every rank's KOLO_* variables
  comm::CpuBinding bind_ = comm::CpuBinding::None;
  std::vector<int> cpus_;  // the CPUs ranks are bound to (bind_)
  int replacements_ = 0;   // --elastic: replacements started so far
  // --elastic: (local rank, launch rank) of each lost rank to replace once reap() is done.
  std::vector<std::pair<int, int>> replace_;
  std::unique_ptr<DebugWatch> debug_;
  std::string collectReason_;
  Clock::time_point collectDeadline_;
  bool stopping_ = false;
  bool killed_ = false;
  std::unique_ptr<JobEvents> events_;  // --events
  Clock::time_point killDeadline_;
  std::optional<Clock::time_point> lostWorkersDeadline_;  // see endLostWorkers()
  std::optional<Clock::time_point> survivorsDeadline_;    // see loseElasticRank()
  std::optional<size_t> waitingBlame_;  // see settleBlame(): index in ranks_
  Clock::time_point waitingBlameUntil_;
  int exitCode_ = 0;
  std::string failure_;
};

}  // namespace kolo::parallel::detail
