// The native communicator backend: shared memory between ranks on one host, TCP between
// hosts, rendezvous through a Store. Collective algorithms are selectable per call.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/comm/store.h"

namespace kolo::comm {

struct NativeOptions {
  /// Default deadline for every wait (KOLO_TIMEOUT seconds overrides, read by initFromEnvironment).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// Identifies this rank's host; ranks with equal ids use shared memory with each other.
  /// Empty: derived from the machine (hostname + boot id + network namespace).
  std::string hostId;
  /// Address to listen on for TCP peers (IPv4 or IPv6 literal or host name); empty: this
  /// host's address as seen by the store connection, else all interfaces.
  std::string listenAddress;
  /// Use shared memory between ranks on the same host (otherwise TCP everywhere).
  bool sharedMemory = true;
  /// Key prefix in the store, so several communicators can share one store.
  std::string storePrefix = "kolo";
  /// Algorithm used where a call asks for Auto. Auto here means: the KOLO_ALGO environment
  /// variable if set (read once, by createNativeCommunicator), else chosen per call by
  /// message size and topology.
  Algorithm algorithm = Algorithm::Auto;
  /// Let ranks on one host read each other's buffers directly (Linux cross-memory attach,
  /// process_vm_readv) for large all-reduces; falls back to the rings where the kernel
  /// refuses. All ranks must agree.
  bool crossMemoryAttach = true;
  /// Smallest all-reduce (bytes) that Auto sends through cross-memory attach.
  size_t crossMemoryAttachMinBytes = 64 * 1024;
  /// Bytes of each shared-memory ring (one per direction per pair of local ranks that
  /// exchange messages, created on first use); 0 picks by the number of local ranks (1 MiB
  /// up to 4, then less). Rounded up to a power of two.
  size_t ringBytes = 0;
};

/// Collective over `size` ranks: every rank calls it with its own rank and the same store.
/// Each rank publishes its host id, process id and TCP endpoint under storePrefix and reads
/// back the host table, its host's records and those of the peers the built-in algorithms
/// pair it with (not every rank's: docs/scale.md); ranks with the same host id talk through
/// shared memory that never has a name (a control block created by the lowest rank of the
/// host, rings created by their writers on first use; see docs/comm.md), all others over
/// TCP connections that must present a per-job token drawn by rank 0, each opened when an
/// operation first needs that peer. Where a peer outside that set listens is read from the
/// store then, so the store must still be reachable (`kolo run` keeps it for the whole
/// job); without it the operation waits for the peer to connect and, at its deadline,
/// throws Timeout saying why. Blocks until all ranks have joined; throws Timeout naming
/// the ranks that did not, PeerError naming the rank (and its host id) when a local peer
/// exits during rendezvous, IoError when a socket cannot be set up or the host's shared
/// memory cannot hold the job (the message says how much was needed and where),
/// InvalidArgument for a bad rank or size. The communicator's operations throw PeerError
/// when a peer closes or resets its connection, its process exits, or nothing listens at
/// its address any more when it is first connected to.
std::shared_ptr<Communicator> createNativeCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                                       const NativeOptions& options = {});

}  // namespace kolo::comm
