// A host store's way to the root store: the requests of a host's ranks, read by a
// TcpStoreServer whose options name an upstream, are forwarded to the root in batches, so
// that the root sees a few connections per host instead of one per rank and a few requests
// per batch instead of one per rank (kolo/comm/stores.h, TcpStoreServerOptions::upstream).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "comm/store/tcp_wire.h"
#include "kolo/comm/stores.h"

namespace kolo::comm::detail {

/// One request of a local connection, as the host store's event loop hands it over.
struct ForwardedRequest {
  uint64_t connection = 0;
  uint64_t serial = 0;  // tells this request apart from the connection's earlier ones
  StoreRequest request;
  std::chrono::steady_clock::time_point deadline;  // of a request that waits
};

/// Hands a reply frame (length prefix included) back to the event loop for the connection;
/// an empty frame closes it (the root was lost). Called from the uplink's threads.
using DeliverReply = std::function<void(uint64_t connection, uint64_t serial, Bytes frame)>;

/// The upstream side of a host store. Protocol with the root, per batch of the requests
/// that arrived while the previous batch was being served (requests of different
/// connections that are pending together are concurrent, so any order among them is a
/// valid one; a connection has one request pending at a time):
///   - the sets of the batch as one multi-set; compare-and-sets and removes one each;
///   - the adds to one key as one add of their sum, each answered with its own running value;
///   - checks as one check-each over the union of their keys;
///   - gets, waits and multi-gets as one get-available over the union of their keys (no
///     wait); the requests not complete yet wait here with what they got so far, and one
///     watcher connection waits at the root for any of the keys still missing (a get-available
///     that also watches a wake key of this host store, which a later batch sets when it adds
///     keys to watch, so that the watch is renewed, not polled);
///   - a batch's arrivals at one barrier as one arrival counting them all, on a connection
///     of its own (barriers block), each rank answered with its own arrival number.
/// The root therefore sees three connections per host store (batches, watcher, barriers)
/// plus one per barrier that is open at the same time. A multi-get answered here gathers
/// its values as they appear rather than in one instant (store keys the control plane reads
/// are written once). Construction connects to the root (IoError when it cannot within the
/// options' connect timeout); when the root is lost later, every pending and later request
/// is answered by closing its connection, as a lost root store would be.
class HostStoreUplink {
 public:
  HostStoreUplink(const TcpStoreClientOptions& root, DeliverReply deliver);
  ~HostStoreUplink();
  HostStoreUplink(const HostStoreUplink&) = delete;
  HostStoreUplink& operator=(const HostStoreUplink&) = delete;

  /// Queues a request for the next batch; does not block on the root.
  void submit(ForwardedRequest request);
  /// Stops the uplink's threads (interrupting their requests to the root); idempotent.
  void stop();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo::comm::detail
