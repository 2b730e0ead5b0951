// Measuring the control plane at thousands of ranks on one machine: simulated ranks (threads
// of a few forked processes) each run the real rendezvous code of the native backend and of
// an elastic regroup, with a real TCP store client each, against one real TCP store server
// (the root), directly or through a host store per simulated host as `kolo run` hosts one
// on each host; the data plane (shared memory, TCP between ranks) is left out. `kolo bench
// rendezvous` prints what it returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kolo::launch {

struct RendezvousBenchmarkOptions {
  /// Simulated ranks, at least 2.
  int ranks = 1024;
  /// Simulated hosts (the ranks are split into this many contiguous groups, as `kolo run`
  /// places them); 0: one host per 8 ranks. What a rank does once per host (the host's
  /// shared-memory record) is done once per group.
  int hosts = 0;
  /// Percent of the ranks (0 to 50) that vanish after the first barrier; the survivors
  /// then regroup as an elastic job's members do. 0: no regroup phase.
  double dropPercent = 0;
  /// Ranks per forked process (each holds one store connection per rank); 0: 4096. With
  /// host stores a process holds whole hosts (at least one, whatever its size).
  int ranksPerProcess = 0;
  /// Whether each simulated host's ranks connect to a host store (a TcpStoreServer with an
  /// upstream, run by the process that holds the host's ranks, as `kolo run` runs one per
  /// host) that forwards to the root in batches; false: every rank connects to the root.
  bool hostStores = true;
  /// Every rank also reads every rank's record (one multi-get), as the native communicator
  /// did when it connected to every peer at rendezvous: the baseline that reading only the
  /// records a rank needs is measured against.
  bool fullAddressBook = false;
  /// Deadline of every store wait.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

struct RendezvousBenchmarkResult {
  int ranks = 0;
  int hosts = 0;
  int processes = 0;
  int lost = 0;
  /// Host stores in front of the root (0: the ranks connected to the root).
  int hostStores = 0;
  /// From the first connect until every rank holds what it needs (token, peers' records,
  /// the host record, the agreement on cross-memory attach, the clock exchange).
  double rendezvousSeconds = 0;
  /// From then until every rank has left a counter barrier.
  double barrierSeconds = 0;
  /// From then until every rank has made a training step's store operations (a counter
  /// increment and a flag check).
  double stepSeconds = 0;
  /// With dropPercent: from the moment the lost ranks are marked lost until every survivor
  /// knows the new membership, has exchanged records again and passed a barrier.
  double regroupSeconds = 0;
  /// Neighbours' records every rank read and found to be the ones they published: 2 per
  /// rank, and 2 per survivor with a drop.
  int64_t neighboursChecked = 0;
  /// Growth of the store process's resident memory from before the server started to its
  /// peak (VmHWM), bytes.
  uint64_t storePeakBytes = 0;
  /// What the root store served (the host stores' requests to it, with host stores).
  uint64_t storeRequests = 0;
  uint64_t storeConnections = 0;
  uint64_t storeBytesReceived = 0;
  uint64_t storeBytesSent = 0;
  /// The open-file limit the benchmark ran under (raised to the hard limit): the store
  /// holds one descriptor per rank, so it bounds `ranks`.
  uint64_t fileLimit = 0;
};

/// Runs the benchmark: starts a TCP store server in this process, forks
/// ceil(ranks / ranksPerProcess) processes whose threads are the ranks, and collects each
/// phase's time. Raises this process's open-file limit to its hard limit. Throws
/// InvalidArgument for options outside their ranges or more ranks than the file limit
/// allows, and Error with the first failing rank's message when a rank fails.
RendezvousBenchmarkResult benchmarkRendezvous(const RendezvousBenchmarkOptions& options);

/// The result as a table (one phase per line) and as one JSON line with the fields ranks,
/// hosts, host_stores, processes, lost, rendezvous_s, barrier_s, step_s, regroup_s (with a
/// drop), neighbours_checked, store_peak_bytes, store_requests, store_connections,
/// store_bytes_received, store_bytes_sent, file_limit.
std::string rendezvousBenchmarkTable(const RendezvousBenchmarkResult& result);
std::string rendezvousBenchmarkJson(const RendezvousBenchmarkResult& result);

}  // namespace kolo::launch
