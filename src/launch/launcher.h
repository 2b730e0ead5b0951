// The `kolo run` launcher: starts the local ranks of a job with their KOLO_* variables,
// hosts the TCP store (single node, or node 0 of several), prefixes every output line with
// its rank, forwards SIGINT/SIGTERM and stops every rank when one fails.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "comm/affinity.h"

namespace kolo::parallel {

struct LauncherOptions {
  /// Ranks started on this node (KOLO_LOCAL_SIZE).
  int procsPerNode = 1;
  /// Nodes in the job; every node runs one launcher with the same procsPerNode.
  int nnodes = 1;
  /// This node's index; global rank = nodeRank * procsPerNode + local rank.
  int nodeRank = 0;
  /// "HOST:PORT" of the TCP store. Node 0 hosts it on PORT (every interface); the other
  /// nodes connect to it. Empty (single node only): hosted on 127.0.0.1, a free port.
  std::string storeAddress;
  /// Job token; empty: KOLO_TOKEN, and where that is unset too, a random one on a single
  /// node. Several nodes must share one; none there is an InvalidArgument.
  std::string token;
  /// Seconds given to the ranks as KOLO_TIMEOUT (their default collective deadline) and
  /// used for the launchers' own rendezvous; 0: KOLO_TIMEOUT is left as inherited and
  /// the rendezvous waits 5 minutes.
  double timeoutSeconds = 0;
  /// After SIGTERM, how long ranks get before SIGKILL.
  std::chrono::milliseconds gracePeriod{std::chrono::seconds(5)};
  /// Core: local rank i starts bound to one CPU, the i-th (modulo their count) of those the
  /// launcher may use, as mpirun binds its ranks; None: ranks inherit the launcher's mask.
  /// A single local rank (procsPerNode 1) is never bound.
  comm::CpuBinding bind = comm::CpuBinding::Core;
  /// A parameter-server job (kolo run --ps P --workers W) when psServers > 0: the job has
  /// P + 1 + W ranks, of which this node runs psNodeRanks(...).count (procsPerNode is set
  /// to that); ranks 0..P-1 are servers, rank P the chief, the others workers, and each gets
  /// KOLO_ROLE (ps, chief, worker), KOLO_ROLE_INDEX, KOLO_PS_SERVERS and KOLO_PS_WORKERS. A
  /// worker that fails does not stop the job (the chief hands its data to the others); a
  /// server or the chief that fails does, on every node.
  int psServers = 0;
  int psWorkers = 0;
  /// kolo run --join: one more worker for the parameter-server job whose store is at
  /// storeAddress (token required): it reads P and W there, takes the next worker index and
  /// starts one rank as that worker. Its failure is the launcher's exit status.
  bool psJoin = false;
  /// Directory of the ranks' flight recorders (their KOLO_DEBUG_DIR): when set, a failed
  /// rank or a stall makes every rank dump its ring there (SIGUSR1) before the job is
  /// stopped, and the launcher prints the hang diagnosis. Empty: KOLO_DEBUG_DIR as
  /// inherited; with stallSeconds and neither, a new directory under TMPDIR.
  std::string debugDir;
  /// JSON-lines file that this node's launcher appends its events to (the job's launch, each
  /// rank that ended in failure with its signal or exit status, the job's end), for `kolo
  /// report`; empty: none.
  std::string eventsFile;
  /// Seconds without progress of any local rank's flight recorder after which the job is
  /// diagnosed and stopped; 0: never.
  double stallSeconds = 0;
  /// A rank other than 0 that fails does not stop the job (federated client hosts: the
  /// server on rank 0 leaves their clients out); rank 0's failure still does.
  bool tolerateFailures = false;
  /// kolo run --elastic: a rank that fails does not stop the job while at least minRanks
  /// ranks are still running; the launcher marks it lost in the store
  /// (parallel::elasticLostKey) so the survivors regroup without waiting for it, and gives
  /// the ranks KOLO_ELASTIC_MIN_RANKS. Fewer than minRanks running ranks stop the job with
  /// an error that says so (across nodes the ranks judge it: see maxNodes).
  bool elastic = false;
  int minRanks = 1;
  /// --elastic: a lost rank is replaced by a new process with the next launch rank (-n,
  /// -n + 1, ... on one node; unique across nodes; KOLO_ELASTIC_JOIN set) while this node
  /// runs fewer than procsPerNode ranks and fewer than maxRanks replacements were started; it joins at a step boundary (ElasticContext::join).
  /// The ranks get KOLO_ELASTIC_MAX_RANKS (the most members a generation admits). 0:
  /// procsPerNode × the nodes; below the ranks the job starts with is an InvalidArgument.
  int maxRanks = 0;
  /// --elastic --nnodes MIN:MAX: nnodes is MIN, the nodes 0..MIN-1 that start the job
  /// together; nodes MIN..MAX-1 may start later, and their ranks (launch ranks nodeRank × -n +
  /// local rank) join the running job as replacements do. 0: nnodes. Across nodes each
  /// launcher replaces its own lost ranks up to -n, the generations hold at most maxRanks
  /// (default -n × MAX) members, and --min-ranks is left to the ranks (they stop together,
  /// after a checkpoint, when fewer are left).
  int maxNodes = 0;
  /// PROGRAM ARGS... (PROGRAM is looked up in PATH).
  std::vector<std::string> command;
};

/// The ranks node `nodeRank` of `nnodes` runs in a parameter-server job of `ranks` ranks:
/// the ranks in their order (servers, the chief, workers) in nearly equal contiguous blocks,
/// the larger ones first, as mpirun places ranks by slot. With --ps 1 --workers 2 on two
/// nodes node 0 runs the server and the chief, node 1 the two workers.
struct NodeRanks {
  int first = 0;
  int count = 0;
};
NodeRanks psNodeRanks(int ranks, int nnodes, int nodeRank);

/// Parses `kolo run --nnodes`: "M" (options.nnodes), or "MIN:MAX" for an elastic job whose
/// nodes MIN..MAX-1 join later (options.maxNodes too). Throws InvalidArgument naming the text
/// for anything but whole numbers of at least 1, and for MIN:MAX without options.elastic or
/// with MAX below MIN.
void parseNodeRange(const std::string& text, LauncherOptions& options);

/// `srun --ntasks-per-node=1 kolo run -n G ...` in an allocation of several nodes: one
/// launcher per node, as `kolo run --nnodes M --node-rank R --store HOST:PORT` on each, with
/// M, R and the store (the step's first node, kolo/comm/init.h) from Slurm's variables. The
/// token is KOLO_TOKEN, else one named after the job: not a secret, as under srun without
/// kolo run (set KOLO_TOKEN outside a trusted network). Returns false outside such a step.
bool nodesFromSlurm(LauncherOptions& options);

/// Runs the job to its end and returns the launcher's exit status: 0 when every rank
/// exited 0; the first failing rank's exit status (128 + signal for a rank killed by a
/// signal) after stopping the others; 128 + signal when the launcher itself got SIGINT or
/// SIGTERM; 1 when another node reported a failure or the store was lost. Diagnostics
/// go to stderr prefixed "kolo run: ". While it runs it catches SIGINT, SIGTERM and SIGCHLD
/// and ignores SIGPIPE in this process (restored afterwards); one launcher per process at
/// a time. No rank outlives the launcher: should this process die (even by SIGKILL), the
/// kernel SIGKILLs every rank (their parent-death signal, tied to the calling thread, which
/// runs the whole job) and a guard process SIGKILLs what is left in their process groups;
/// the same happens to running ranks if this function throws. Throws InvalidArgument for
/// bad options and IoError when the store cannot be hosted or reached.
int runLauncher(const LauncherOptions& options);

}  // namespace kolo::parallel
