// The parameter-server strategy (DistBelief's Downpour SGD, Li et al.'s parameter server,
// TensorFlow's ParameterServerStrategy): P server processes hold the variables, sharded by
// bytes, with their optimizer state, and apply the updates; W workers pull parameters, compute
// gradients on their batches and push them; a chief hands out data in small units, evaluates
// and writes the results. Updates are synchronous (the mean of every worker's gradient, the
// math of synchronous data parallelism), asynchronous (applied on arrival) or stale-synchronous
// (no worker more than S updates ahead of the slowest). Every connection is a TCP socket that
// presents the job token first; every wait has a deadline; a peer that vanishes is a PeerError
// naming it, except a worker, whose loss the servers and the chief survive.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/comm/store.h"
#include "kolo/optim.h"
#include "kolo/parallel/strategy.h"

namespace kolo::parallel::ps {

using Millis = std::chrono::milliseconds;

/// How a server turns pushes into updates.
enum class Mode {
  Sync,   // one update per round: the mean of the gradients of every worker still in the job
  Async,  // each push is applied on arrival (Downpour)
  Ssp,    // applied on arrival, but a worker waits while it is more than S pushes ahead
};
const char* modeName(Mode mode);

/// How values cross the wire: f32 as they are, or bf16 or fp16 (half the bytes; gradients and
/// the parameters a worker computes with are rounded to 16 bits, the servers keep f32; fp16
/// messages are scaled by a power of two against overflow and underflow).
enum class Compression : uint32_t { None = 0, Bf16 = 1, Fp16 = 2 };
/// Parses "none", "bf16", "fp16"; InvalidArgument otherwise.
Compression parseCompression(const std::string& name);
/// Parses "sync", "async", "ssp"; InvalidArgument otherwise.
Mode parseMode(const std::string& name);

// ---------------------------------------------------------------------------------------
// Placement

/// A contiguous range [begin, end) of one parameter's flat elements, held by one server.
struct Slice {
  int parameter = 0;  // index into Placement::names
  int64_t begin = 0;
  int64_t end = 0;
  int server = 0;
  int64_t size() const { return end - begin; }
};

/// Where every parameter lives. Slices of one server are listed in the order its messages
/// carry them (parameter order, then begin).
struct Placement {
  int servers = 1;
  std::vector<std::string> names;  // parameters in the model's order
  std::vector<int64_t> sizes;      // their element counts
  std::vector<Slice> slices;       // every slice, grouped by server

  /// The slices of `server`, in message order.
  std::vector<Slice> slicesOf(int server) const;
  /// Elements `server` holds (the f32 count of its pulls and pushes).
  int64_t elementsOf(int server) const;
};

/// Places f32 parameters of `sizes` elements over `servers` servers, balanced by bytes: a
/// parameter of more than `shardBytes` bytes is split into `servers` nearly equal ranges, one
/// per server; the others go whole, largest first, to the server holding the fewest bytes
/// (ties: the lowest index). Deterministic, so every process computes the same placement.
Placement placeParameters(const std::vector<std::string>& names, const std::vector<int64_t>& sizes,
                          int servers, int64_t shardBytes);
/// placeParameters over a module's named parameters.
Placement placeParameters(const NamedTensors& parameters, int servers, int64_t shardBytes);

// ---------------------------------------------------------------------------------------
// Server

struct ServerOptions {
  int index = 0;    // this server's index, 0..P-1 (names it in messages)
  int workers = 1;  // W: the workers every sync round waits for (those that left excepted)
  Mode mode = Mode::Sync;
  int staleness = 2;               // S of Mode::Ssp
  /// async/ssp: a gradient computed on a version tau updates old enters the update divided
  /// by max(1, tau) (staleness-aware SGD, Zhang et al. 2016); sync ignores it.
  bool stalenessLr = false;
  std::string token;               // every connection must present it first
  std::string host = "127.0.0.1";  // address to listen on
  uint16_t port = 0;               // 0: a free port (see ParameterServer::port())
  /// Deadline of every wait: a sync round for a worker that sent nothing, an SSP wait for
  /// the slowest, a connection's hello, a reply the peer does not read.
  Millis timeout{std::chrono::seconds(300)};
};

/// Counters of one server, as the chief reads them (Stats request) and tests inspect.
struct ServerStats {
  int64_t updates = 0;       // optimizer steps applied (the server's version)
  int64_t pushes = 0;        // gradient pushes received
  int64_t bytesIn = 0;       // gradient bytes received
  int64_t bytesOut = 0;      // parameter bytes sent
  int64_t stalenessMax = 0;  // largest (version at apply - version the gradient was computed on)
  int64_t stalenessSum = 0;  // their sum over `pushes`
  int64_t leadMax = 0;       // SSP: the largest lead over the slowest a worker was let go with
  int64_t workersLost = 0;   // workers whose connection dropped without leaving
  int64_t sharedWorkers = 0;  // worker connections that exchanged through shared memory
  int64_t valuesInPlace = 0;  // sync replies whose worker read the values from the server's
                              // own shared memory (no copy on the server)
};

/// One server: holds its slices of the parameters (taken from `initial`, which every process
/// builds the same way) and an optimizer over them, and serves workers and the chief on its
/// own threads (one per connection) until the chief sends Shutdown or stop() is called.
/// The learning rate of update u is lrAt(u) (empty: the optimizer's own, unchanged).
class ParameterServer {
 public:
  /// Binds the listening socket (IoError when it cannot) and takes the initial values; does
  /// not serve yet.
  ParameterServer(ServerOptions options, Placement placement, const NamedTensors& initial,
                  const OptimizerFactory& makeOptimizer, std::function<double(int64_t)> lrAt);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  /// The port it listens on.
  uint16_t port() const;
  /// Serves until Shutdown or stop(); blocking. Rethrows nothing: a connection's protocol
  /// error closes that connection only (and counts as a lost worker).
  void serve();
  /// Makes serve() return soon and closes every connection; idempotent, thread-safe.
  void stop();
  ServerStats stats() const;
  /// The server's current values of its slices, flattened in message order.
  std::vector<float> values() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------
// Client (workers and the chief)

enum class ClientRole { Worker, Chief };

struct ClientOptions {
  ClientRole role = ClientRole::Worker;
  int index = 0;  // worker index (0..W-1); 0 for the chief
  /// Each connection chooses its own: workers may push bf16 while the chief pulls f32.
  Compression compression = Compression::None;
  std::string token;
  /// Deadline of connecting (servers may start later) and of every reply.
  Millis timeout{std::chrono::seconds(300)};
  /// Exchange values through shared memory with a server on this host (the connection then
  /// carries only headers); TCP with servers elsewhere, with compression, or when the
  /// segment cannot be made or mapped. false: TCP always.
  bool sharedMemory = true;
};

/// A worker's or the chief's connections to every server, one socket each. Gradients go out
/// from the tensors' memory and parameters come back straight into them, or, with a server on
/// the same host, through a shared-memory segment per connection (the socket carrying only
/// headers): gradients placed there (placeGradients) need no copy, and sync replies are
/// read from the server's own values (mapped too): copied from there into the parameters,
/// or not at all for parameters whose storage they are (placeValues); requests
/// to all servers are sent before any reply is read, so the servers work in parallel. A
/// server that
/// closes its connection, or sends no reply in time, is a PeerError (Timeout) naming it.
/// Not thread-safe.
class ServerGroup {
 public:
  /// Connects to `addresses` ("host:port" of server 0..P-1) and presents the token.
  ServerGroup(ClientOptions options, Placement placement, std::vector<std::string> addresses);
  ~ServerGroup();
  ServerGroup(ServerGroup&&) noexcept;
  ServerGroup& operator=(ServerGroup&&) noexcept;

  /// Copies every server's current values into `parameters` (the module's, in placement
  /// order) and returns the lowest server version seen.
  int64_t pull(const NamedTensors& parameters);
  /// Pushes the gradients of `parameters` (their .grad(), computed on the parameters of
  /// version `basedOn`) and receives the values to use next into the parameters; returns the
  /// new version. Blocks as the mode says: sync until the round is applied, ssp while this
  /// worker is more than S pushes ahead of the slowest.
  int64_t pushPull(const NamedTensors& parameters, int64_t basedOn);
  /// This worker takes no part in sync rounds (and SSP's slowest) until its next push.
  void leave();
  /// Every server's counters.
  std::vector<ServerStats> stats();
  /// Tells every server to stop (chief only); servers already gone are skipped.
  void shutdown();
  /// Tells every server that worker `worker` is lost (chief only): it leaves the sync rounds
  /// and SSP's slowest for good, its connection is closed and a push it still sends is
  /// refused.
  void drop(int worker);
  /// Every server writes its values, optimizer state and version to
  /// `directory`/server-<i>.safetensors (atomically) and answers once it is on disk; a
  /// consistent checkpoint needs the servers quiet (no pushes in flight). Chief only.
  void checkpoint(const std::string& directory);
  /// Every server replaces its values, optimizer state and version with those of
  /// `directory`/server-<i>.safetensors (as checkpoint() writes them, for the same placement)
  /// and answers once it has. The servers must be quiet (no worker pushing). Chief only.
  /// Throws PeerError naming the server and the file when one cannot (another optimizer,
  /// slices that do not fit).
  void restore(const std::string& directory);
  const Placement& placement() const;
  /// How many of the servers this group exchanges values with through shared memory.
  int sharedServers() const;
  /// How many of those let this group read their values straight from their own memory.
  int sharedValueServers() const;
  /// Makes the gradients of `parameters` live in the shared segments, so that a push copies
  /// nothing: each parameter held whole by a server that shares memory gets a gradient
  /// tensor over its place in that server's segment (its current gradient copied in). The
  /// caller must not touch those gradients while a push is in flight (which may leave them
  /// changed: async scales stale ones) and gives this group only these parameters to push
  /// from then on (the segment holds one gradient). Returns
  /// how many parameters were placed; the others keep their gradients and are copied.
  int placeGradients(const NamedTensors& parameters);
  /// A worker of sync servers on this host: makes each parameter held whole by such a server
  /// use that server's values as its storage, mapped read-only, so that no reply is copied
  /// (the values cannot change while this worker is in the rounds, and a pull puts it back
  /// in them). The caller must not write these parameters. Returns how many were placed;
  /// the others are copied into at each reply. 0 for the chief.
  int placeValues(const NamedTensors& parameters);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// A worker's step exchange with the servers, optionally overlapped with its compute.
///
/// Not overlapped (sync, where the math must be synchronous training's): pushAndSwap() pushes
/// the gradients of current() and waits for the values to use next, in place.
///
/// Overlapped (async, ssp): the worker keeps two replicas of the parameters and computes on
/// current() while the other replica's exchange (its gradients pushed, the servers' newest
/// values received into it) runs on a thread of this object. pushAndSwap() waits for that
/// exchange, starts current()'s and makes the other replica current, so a step computes on
/// the values of the exchange before the previous one: its gradient misses the worker's own
/// last update (one more update of staleness) but no step waits for a round trip. Pushes
/// still leave one at a time, each after the previous reply, so SSP's bound on pushes holds.
///
/// With a look-ahead factor a > 0 (overlapped only), a step computes not on the newest reply
/// r_k but on r_k + a (r_k - r_{k-1}), the previous reply's change carried on: an estimate of
/// the values its gradient will land on, several updates later.
class WorkerExchange {
 public:
  /// `replicas`: the parameters of one model (not overlapped) or of two identical models
  /// (overlapped), in placement order; they must outlive this object, as must `servers`.
  WorkerExchange(ServerGroup& servers, std::vector<NamedTensors> replicas,
                 double lookahead = 0.0);
  /// Waits for the exchange in flight (its error is dropped) and ends the thread.
  ~WorkerExchange();
  WorkerExchange(const WorkerExchange&) = delete;
  WorkerExchange& operator=(const WorkerExchange&) = delete;

  bool overlapped() const;
  /// The replica to compute the next gradients on (0 or 1).
  int current() const;
  /// The version of the servers' values current() holds.
  int64_t version() const;
  /// Pulls the servers' values into current(), after settle().
  void pull();
  /// Pushes the gradients of current(), computed on version(), and makes current() a replica
  /// with values to go on with (see the class comment). Rethrows an error of the exchange
  /// thread (PeerError, Timeout) here.
  void pushAndSwap();
  /// Waits for the exchange in flight, if any, and makes its replica current (the newest
  /// values this worker has). Call before using the ServerGroup directly (leave, pull).
  void settle();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------
// Data units (the chief's dispatcher and the workers' client)

/// A range of positions [begin, end) of epoch `epoch`'s sample order.
struct Unit {
  int64_t id = -1;
  int64_t epoch = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct DispatchOptions {
  int workers = 1;
  int64_t samplesPerEpoch = 0;  // positions of one epoch's order that are used
  int64_t unitSamples = 512;    // samples per unit (the last of an epoch may be shorter)
  /// The epoch is cut into cycles of this many equal units (the last cycle's shorter units
  /// equal too), so that this many workers taking one unit each per cycle, as sync workers
  /// pushing in step do, hold the same number of batches throughout. samplesPerEpoch and
  /// lastEpochSamples must be multiples of it. 1: units of unitSamples, the last shorter.
  int unitsAlike = 1;
  int64_t epochs = 1;
  /// Positions of the last epoch's order that are used (a run that ends mid-epoch, by its
  /// step count); 0: samplesPerEpoch.
  int64_t lastEpochSamples = 0;
  std::string token;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  Millis timeout{std::chrono::seconds(300)};
  /// The first epoch to hand out (a resumed job starts after its checkpoint's epoch).
  int64_t firstEpoch = 0;
  /// Units of an epoch are handed out only once releaseEpoch() allowed it (firstEpoch is
  /// allowed from the start): the chief checkpoints the quiet servers in between.
  bool pauseBetweenEpochs = false;
  /// A worker that opened a heartbeat connection (UnitClient with a heartbeat) and sent
  /// nothing on it for this long is lost, though its sockets are open (stopped, hung): its
  /// unit goes to the others and its connection is closed. 0: no heartbeats.
  Millis heartbeat{0};
  /// Called (from the dispatcher's monitor thread, no lock held) with the index of a worker
  /// declared lost for missed heartbeats: the chief tells the servers (ServerGroup::drop).
  std::function<void(int)> onLost;
};

/// What a worker reports when it asks for its next unit.
struct UnitReport {
  int64_t completed = -1;  // the unit it finished (-1: none)
  double lossSum = 0.0;    // sum of its batches' mean losses
  int64_t batches = 0;
};

/// A worker lost during the job.
struct LostWorker {
  int index = 0;
  double atSeconds = 0.0;  // since the dispatcher started
  int64_t unit = -1;       // the unit it held, handed to the others (-1: none)
  bool heartbeat = false;  // declared lost for missed heartbeats (else: its connection dropped)
};

/// One finished epoch as the workers reported it.
struct EpochReport {
  double lossSum = 0.0;  // sum of the mean losses of its batches
  int64_t batches = 0;
  double seconds = 0.0;  // when its last unit was reported, since the first unit was handed out
};

/// The chief's side: serves units to workers on its own threads, in order, a unit at a time
/// per worker, so faster workers take more. A worker whose connection drops before it
/// reported its unit done is lost: its unit goes back to the front of the queue.
class UnitDispatcher {
 public:
  explicit UnitDispatcher(DispatchOptions options);
  ~UnitDispatcher();
  UnitDispatcher(const UnitDispatcher&) = delete;
  UnitDispatcher& operator=(const UnitDispatcher&) = delete;
  uint16_t port() const;
  /// Blocks until every unit of `epoch` is done. Throws Timeout when no unit is reported for
  /// `timeout`, PeerError when every worker is lost.
  EpochReport waitEpoch(int64_t epoch);
  /// Lets the units of `epoch` (and earlier) be handed out (pauseBetweenEpochs).
  void releaseEpoch(int64_t epoch);
  /// After the last epoch: waits until every connected worker was told that the job is
  /// finished (or is lost); Timeout after the deadline.
  void waitWorkersFinished();
  std::vector<LostWorker> lost() const;
  int workersAlive() const;
  /// Units done by each worker.
  std::vector<int64_t> unitsDone() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// A worker's connection to the dispatcher.
class UnitClient {
 public:
  /// With `heartbeat` > 0 a thread of its own sends a heartbeat to the chief every
  /// `heartbeat` / 4 on a second connection, until the client is destroyed.
  UnitClient(const std::string& address, int worker, const std::string& token, Millis timeout,
             Millis heartbeat = Millis{0});
  ~UnitClient();
  /// Reports `report` and returns the next unit; nullopt when the job is finished. Waits
  /// (polling the dispatcher) while every remaining unit is held by another worker; calls
  /// `idle` once before the first such wait.
  std::optional<Unit> next(const UnitReport& report, const std::function<void()>& idle);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------------------
// Roles of a job started by `kolo run --ps P --workers W`

enum class Role { Server, Worker, Chief };

/// What a process of a parameter-server job learns from its environment.
struct RoleInfo {
  Role role = Role::Worker;
  int index = 0;      // among the processes of its role
  int servers = 1;    // P
  int workers = 1;    // W
  std::string store;  // KOLO_STORE ("" under mpirun / srun: none was given)
  std::string token;  // KOLO_TOKEN
  bool local = true;  // every process of the job runs on this host
};

/// Reads KOLO_ROLE, KOLO_ROLE_INDEX, KOLO_PS_SERVERS, KOLO_PS_WORKERS, KOLO_STORE and
/// KOLO_TOKEN (kolo run --ps sets them). Without KOLO_ROLE, under mpirun, srun or torchrun
/// with KOLO_PS_SERVERS=P, the rank decides: ranks 0..P-1 are servers, rank P the chief, the
/// rest workers. Throws InvalidArgument naming what is missing.
RoleInfo roleFromEnvironment();

/// The address of this host that peers reach it at, as the connection to the store sees it
/// (127.0.0.1 for a store that is not TCP).
std::string localHost(comm::Store& store);

}  // namespace kolo::parallel::ps
