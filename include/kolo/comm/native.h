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
};

/// Collective over `size` ranks: every rank calls it with its own rank and the same store.
/// Blocks until all ranks have connected; throws Timeout naming the ranks that did not.
std::shared_ptr<Communicator> createNativeCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                                       const NativeOptions& options = {});

}  // namespace kolo::comm
