// The Store implementations: in-memory (ranks as threads of one process), file (a
// directory every rank can see) and TCP (a server hosted by `kolo run` or rank 0, and a
// client that must present the job token before it is served).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kolo/comm/store.h"

namespace kolo::comm {

/// Largest key any store accepts (bytes); longer keys throw InvalidArgument.
inline constexpr size_t kMaxStoreKeyBytes = 4096;
/// Largest value any store accepts (bytes); larger values throw InvalidArgument.
inline constexpr size_t kMaxStoreValueBytes = size_t{64} << 20;

/// A store held in this process's memory; every thread that shares the pointer sees the
/// same keys. Waits block on a condition variable until their deadline. Thread-safe.
std::shared_ptr<Store> makeMemoryStore();

/// A store kept in `directory` (created if missing), which every participant must see
/// (a local or shared file system). One file per key, written atomically (temporary file
/// + rename); `add` serialises through an flock'ed lock file; waits poll with backoff.
/// Throws IoError when the directory cannot be created.
std::shared_ptr<Store> makeFileStore(const std::string& directory);

/// Host and port parsed from "HOST:PORT", "[IPV6]:PORT" or "IPV6%SCOPE" forms.
struct HostPort {
  std::string host;
  uint16_t port = 0;
  /// "host:port", with brackets around IPv6 literals.
  std::string toString() const;
};

/// Parses "HOST:PORT" or "[V6ADDR]:PORT"; throws InvalidArgument naming the text otherwise.
HostPort parseHostPort(const std::string& text);

struct TcpStoreServerOptions {
  /// Address to listen on. Empty: every interface, IPv6 and IPv4. A literal or host name
  /// listens on each address it resolves to.
  std::string host;
  /// Port; 0 picks a free one (see TcpStoreServer::port()).
  uint16_t port = 0;
  /// Job token every client must present before any request is served.
  std::string token;
  /// Largest accepted key and value; larger requests close the connection.
  size_t maxKeyBytes = kMaxStoreKeyBytes;
  size_t maxValueBytes = kMaxStoreValueBytes;
  /// "HOST:PORT" of a root store: this server is then a host store, which serves its
  /// host's ranks (checking the same token) by forwarding their requests to the root in
  /// batches (writes of a batch as one multi-set, adds to a key as one add, reads as one
  /// bulk read, a barrier's arrivals as one arrival counting them all), so that the root
  /// sees a few connections per host rather than one per rank. Empty: it serves its own keys.
  std::string upstream = {};
  /// A host store's deadline to connect to the root and for its requests there; the
  /// constructor throws IoError when the root cannot be reached within it.
  std::chrono::milliseconds upstreamTimeout{std::chrono::seconds(60)};
};

/// What a TcpStoreServer has served so far (for benchmarks and `kolo run`'s summary).
struct TcpStoreServerStats {
  /// Requests answered or parked, Hello included.
  uint64_t requests = 0;
  /// Frame bytes read from and written to clients.
  uint64_t bytesReceived = 0;
  uint64_t bytesSent = 0;
  /// Connections accepted.
  uint64_t connections = 0;
};

/// The TCP store server: one thread multiplexing every connection with epoll, requests
/// parked per key (a write looks only at the requests waiting for its key), bulk requests
/// answered in one reply. A connection must send the job token first; a wrong token, an oversized or malformed
/// request closes that connection only. get/wait block in the server until their keys
/// exist or the client's deadline passes. The destructor stops the thread and closes every
/// connection (their clients then get PeerError, an IoError).
class TcpStoreServer {
 public:
  /// Binds and starts serving. Throws IoError when no address could be bound.
  explicit TcpStoreServer(const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The port actually bound (useful with port 0).
  uint16_t port() const;
  /// Number of connections closed for a wrong token, oversized or malformed requests.
  uint64_t rejectedConnections() const;
  /// Counters of what was served so far; safe to call from any thread.
  TcpStoreServerStats stats() const;
  /// Stops serving now and closes every connection; idempotent.
  void stop();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreClientOptions {
  std::string host;
  uint16_t port = 0;
  std::string token;
  /// How long to keep retrying the first connection (the server may start later).
  std::chrono::milliseconds connectTimeout{std::chrono::seconds(60)};
  /// Deadline for requests that do not carry their own (set, add, remove, check).
  std::chrono::milliseconds requestTimeout{std::chrono::seconds(60)};
};

/// A client of TcpStoreServer. Connects in the constructor (retrying until connectTimeout)
/// and presents the token; throws IoError when the server cannot be reached or refuses the
/// token. A server that vanishes later makes the pending call throw PeerError (an IoError
/// naming the server's host:port) and later calls IoError.
/// Thread-safe: requests from several threads are serialised on the one connection.
class TcpStoreClient : public Store {
 public:
  explicit TcpStoreClient(const TcpStoreClientOptions& options);
  ~TcpStoreClient() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  /// One request and one reply each.
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Millis timeout) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  std::vector<bool> checkEach(const std::vector<std::string>& keys) override;
  /// The server answers every arrival of a barrier in one pass when the last one comes.
  int64_t arrive(const std::string& key, int64_t count, Millis timeout) override;
  /// arrive() for `arrivals` arrivals at once (a host store's ranks): adds `arrivals` to the
  /// counter and returns its value after them once it reaches `count`. InvalidArgument
  /// unless 1 <= arrivals < 2^31.
  int64_t arriveMany(const std::string& key, int64_t count, int64_t arrivals, Millis timeout);
  /// The values of those keys that exist (nullopt for the others), waiting up to `timeout`
  /// until at least one does; at the deadline every answer may be nullopt (no Timeout).
  std::vector<std::optional<Bytes>> getAvailable(const std::vector<std::string>& keys,
                                                 Millis timeout);
  /// Atomically sets `key` to `desired` when it holds `expected` (a missing key counts as
  /// holding an empty value) and returns the value the key holds afterwards (empty when
  /// missing): `desired` when the swap happened.
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired);

  /// This end's address of the connection to the server (the address peers on other hosts
  /// can reach this host at, as far as the route to the store goes), without a port.
  std::string localAddress() const;
  /// "host:port" of the server.
  std::string serverAddress() const;
  /// Ends a request in progress on another thread (it fails with IoError) and every later
  /// one: the connection is shut down. For the owner of a client that must stop waiting.
  void interrupt();

 private:
  /// Connects fd_, retrying until `deadline`; IoError when it cannot.
  void connectSocket(std::chrono::steady_clock::time_point deadline);
  /// Sends one request frame and returns the reply body; IoError when the connection
  /// fails or no reply comes before `deadline` (the connection is then unusable).
  Bytes roundTrip(const Bytes& request, std::chrono::steady_clock::time_point deadline);
  /// Deadline for the reply to a request that waits `timeout` in the server.
  std::chrono::steady_clock::time_point replyDeadline(Millis timeout) const;

  TcpStoreClientOptions options_;
  int fd_ = -1;
  bool broken_ = false;
  bool closedByServer_ = false;  // the last failure was an orderly close by the server
  std::mutex mutex_;
};

/// Connects a TcpStoreClient to "HOST:PORT" with the token; the same timeout is used for
/// the connection and for requests without their own deadline.
std::shared_ptr<Store> connectTcpStore(const std::string& address, const std::string& token,
                                       std::chrono::milliseconds timeout);

}  // namespace kolo::comm
