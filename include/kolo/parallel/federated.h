// Federated learning (McMahan et al. 2017): clients train on data that never leaves them and
// send only model updates; a server averages the updates, weighted by the clients' sample
// counts (FedAvg), optionally with a proximal term on the clients (FedProx), secure
// aggregation of the updates (Bonawitz et al. 2017) and differential privacy (DP-FedAvg,
// McMahan et al. 2018). The server and the client hosts talk through a comm::Store: the TCP
// store of `kolo run` between processes, the in-memory store between threads in tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/store.h"
#include "kolo/data.h"
#include "kolo/nn/module.h"

namespace kolo::parallel::fed {

// ---- partitions and sampling ----

/// How the training set is split over the clients.
struct PartitionSpec {
  enum class Kind { Iid, Shards, Dirichlet };
  Kind kind = Kind::Iid;
  int shards = 2;      // Shards: shards per client
  double alpha = 0.5;  // Dirichlet: concentration of each client's label mix
};

/// Parses "iid", "shards:S" (S >= 1) or "dirichlet:ALPHA" (ALPHA > 0); throws
/// InvalidArgument naming the text otherwise.
PartitionSpec parsePartition(const std::string& text);

/// Indices of `labels` (i64 [N]) held by each of `clients` clients, seeded:
/// - Iid: a random permutation cut into `clients` nearly equal parts;
/// - Shards: indices sorted by label (stable), cut into clients * S equal shards, S random
///   shards per client (McMahan's pathological non-IID split);
/// - Dirichlet: for every class, its samples are split over the clients in proportions drawn
///   from Dirichlet(alpha) (label skew and unequal client sizes); a client left empty takes
///   one sample from the largest.
/// Every index appears in exactly one client. Throws InvalidArgument when there are fewer
/// samples than clients (or shards).
std::vector<std::vector<int64_t>> partitionClients(const Tensor& labels, int clients,
                                                   const PartitionSpec& spec, uint64_t seed);

/// Samples that partitionClients reads the labels of at a time.
inline constexpr int64_t kLabelChunk = 1024;

/// partitionClients over `data`'s labels, the same split as over a tensor of them: Iid reads
/// nothing but data.size(); Shards and Dirichlet read the labels through data.gather, at most
/// kLabelChunk samples at a time, so a dataset that is not in memory is never gathered whole.
std::vector<std::vector<int64_t>> partitionClients(const data::Dataset& data, int clients,
                                                   const PartitionSpec& spec, uint64_t seed);

/// The `perRound` distinct clients of round `round` (1-based) out of `clients`, sorted; a
/// function of (clients, perRound, round, seed) only, so any process can recompute it.
std::vector<int> sampleClients(int clients, int perRound, int64_t round, uint64_t seed);

// ---- the model's state as one flat vector ----

/// The model's parameters in namedParameters() order, then its buffers in namedBuffers()
/// order (a batch norm's running mean and variance, and its num_batches_tracked as a float),
/// concatenated (f32). The server averages all of it alike: FedAvg's weighted mean of the
/// clients' states, so the global running statistics are the sample-weighted mean of the
/// clients' (each continued from the global ones over its own samples), as FedAvg
/// implementations average every state_dict entry. Only the mean is taken because secure
/// aggregation reveals the server nothing but the sum.
std::vector<float> flattenState(const nn::Module& model);
/// Writes `flat` (flattenState's layout) into the model's parameters and buffers (integer
/// buffers rounded to the nearest count); throws Mismatch when the length differs from the
/// model's parameter and buffer elements.
void loadState(nn::Module& model, const std::vector<float>& flat);

// ---- a client's local training ----

enum class Method { FedAvg, FedProx };
/// "fedavg" or "fedprox"; throws InvalidArgument otherwise.
Method parseMethod(const std::string& name);

struct LocalTrainingOptions {
  int64_t localEpochs = 1;
  int64_t localBatch = 10;  // 0: the client's whole data in one batch
  double lr = 0.05;         // the client's plain SGD learning rate
  Method method = Method::FedAvg;
  double proxMu = 0.0;  // FedProx: mu/2 ||w - w_global||^2 is added to the loss
  bool shuffle = true;  // reshuffle the client's samples every local epoch
  uint64_t seed = 0;    // shuffling is a function of (seed, round, client, epoch)
  double dpClip = 0.0;  // > 0: the update is scaled to L2 norm at most dpClip
};

/// Local training of one client: loads `global` (flattenState's layout) into `model`, runs
/// `localEpochs` epochs of plain SGD over batches of `localBatch` of `indices` in `data`
/// (gathered a batch at a time: the client reads only its own samples), and returns the update
/// (local state - global), clipped to `dpClip` when set. Not thread-safe per model.
std::vector<float> trainClient(nn::Module& model, const std::vector<float>& global,
                               const data::Dataset& data, const std::vector<int64_t>& indices,
                               const LocalTrainingOptions& options, int64_t round, int client);

/// The order in which trainClient visits `indices` in local epoch `epoch` (0-based).
std::vector<int64_t> clientEpochOrder(const std::vector<int64_t>& indices,
                                      const LocalTrainingOptions& options, int64_t round, int client,
                                      int64_t epoch);

// ---- one client's update on the wire, and the server's checks ----

struct Update {
  int64_t round = 0;
  int32_t client = 0;
  int64_t samples = 0;       // the client's sample count: its weight in the average
  std::vector<float> delta;  // local state - global state (flattenState's layout)
};

/// Frames an update: magic, round, client, samples, count, then count f32 values.
comm::Bytes encodeUpdate(const Update& update);
/// Parses encodeUpdate's frame; throws FormatError naming `from` for a short, oversized or
/// malformed frame (lengths are checked before allocation).
Update decodeUpdate(const comm::Bytes& bytes, const std::string& from);

/// Sums updates of one round weighted by their sample counts, refusing bad ones.
class Aggregator {
 public:
  Aggregator(int64_t round, size_t parameters);
  /// Adds `update` to the weighted sum, or throws (and adds nothing) when it is refused:
  /// Mismatch for another round (stale or ahead), another length than the model's, or a
  /// client that already sent this round; InvalidArgument for a NaN/infinite value (naming
  /// the element) or a sample count below 1. The message names the client.
  void add(const Update& update);
  /// Adds an update with weight 1 (DP-FedAvg), with the same checks.
  void addUnweighted(const Update& update);
  /// The weighted mean of the added updates (zeros when none were added).
  std::vector<float> mean() const;
  /// The plain sum of the weighted updates (f64) and the sum of their weights.
  const std::vector<double>& sum() const { return sum_; }
  double weight() const { return weight_; }
  int added() const { return static_cast<int>(clients_.size()); }

 private:
  void check(const Update& update) const;
  int64_t round_;
  std::vector<double> sum_;
  double weight_ = 0.0;
  std::vector<int32_t> clients_;
};

// ---- differential privacy ----

/// Rényi-DP of the sampled Gaussian mechanism (sampling rate q, noise multiplier sigma) at
/// the integer order alpha >= 2 (Mironov, Talwar and Zhang 2019, section 3.3):
///   eps(alpha) = 1/(alpha-1) * log( sum_{k=0..alpha} C(alpha,k) (1-q)^(alpha-k) q^k
///                                   * exp((k^2 - k) / (2 sigma^2)) )
/// evaluated in log space. q = 1 gives the Gaussian mechanism's alpha / (2 sigma^2).
double sampledGaussianRdp(double q, double sigma, int alpha);

/// Tracks the privacy spent by `rounds` compositions of the sampled Gaussian mechanism and
/// converts it to (epsilon, delta)-DP: eps = min over integer alpha in [2, 256] of
/// rounds * eps(alpha) + log(1/delta) / (alpha - 1).
class RdpAccountant {
 public:
  RdpAccountant(double q, double sigma);
  void step(int64_t rounds = 1) { rounds_ += rounds; }
  int64_t rounds() const { return rounds_; }
  /// Epsilon at `delta` after the rounds so far (0 before the first; infinity for sigma 0).
  double epsilon(double delta) const;

 private:
  std::vector<double> rdp_;  // per round, orders 2..256
  int64_t rounds_ = 0;
};

// ---- the job: server and client hosts over a store ----

struct FederatedOptions {
  int clients = 100;
  int clientsPerRound = 10;
  int64_t rounds = 1;
  LocalTrainingOptions client;
  double serverLr = 1.0;  // w <- w + serverLr * mean update
  /// How long the server waits for the round's updates (and for each secure-aggregation
  /// step); clients not heard from by then are left out of the round.
  std::chrono::milliseconds roundTimeout{std::chrono::seconds(120)};
  /// Simulation of unreliable clients: each selected client drops out with this probability
  /// (seeded), after it has received the model (and, with secureAgg, after the key exchange)
  /// and before it sends. Its host tells the server at once (an empty value under the
  /// client's key), so simulated drop-outs do not cost the round timeout; a silent host
  /// still does. 0: no client drops out.
  double simulatedDropRate = 0.0;
  bool secureAgg = false;
  /// Secure aggregation: shares needed to recover a seed; 0: a majority of the round's
  /// clients (floor(K/2) + 1).
  int saThreshold = 0;
  double dpClip = 0.0;   // DP-FedAvg: per-client L2 clip (0: off)
  double dpNoise = 0.0;  // DP-FedAvg: noise multiplier sigma (noise std = sigma * clip on the sum)
  double dpDelta = 1e-5;
  uint64_t seed = 0;
};

/// Throws InvalidArgument naming the option as `kolo train` spells it (--clients-per-round
/// for clientsPerRound) when `options` cannot run: fewer than one client, round or client per
/// round, more clients per round than clients, a server rate not above 0, a proximal weight
/// without FedProx, a secure-aggregation threshold without secureAgg, DP noise without a
/// clip, a drop rate outside [0, 1] or a delta outside (0, 1). FederatedServer,
/// train::trainFederated and `kolo train` (before reading the data) call it.
void checkOptions(const FederatedOptions& options);

/// What one round did.
struct RoundReport {
  int64_t round = 0;
  int clients = 0;  // updates in the average
  int dropped = 0;  // selected clients not in the average (timed out, dead, dropped, refused)
  std::vector<std::string> refused;  // why each refused update was refused
  int64_t bytesUp = 0;               // update bytes the server received
  int64_t bytesDown = 0;             // model and protocol bytes sent to the selected clients
  double epsilon = -1.0;             // privacy spent so far (-1 without DP)
  double seconds = 0.0;
};

/// The server (rank 0): publishes each round's model and selection under "fed/", collects
/// the updates until all arrived or the round timeout passed, checks them and applies the
/// (weighted, optionally secure and noised) mean.
class FederatedServer {
 public:
  FederatedServer(std::shared_ptr<comm::Store> store, FederatedOptions options,
                  std::vector<float> initial);
  /// Waits until `hosts` client hosts have said they are ready (data loaded), or `timeout`
  /// passed; returns how many are. Keeps the first round's timeout from counting start-up.
  int awaitHosts(int hosts, std::chrono::milliseconds timeout);
  /// Runs the next round and reports it. Missing, late and refused clients are left out;
  /// a secure round with fewer than the threshold of clients left at some step is abandoned
  /// (the weights stay, the reason is in `refused`). Throws only for store failures
  /// (IoError when the store is gone).
  RoundReport runRound();
  /// Tells the client hosts to stop (after the last round).
  void finish();
  /// The global model's state (flattenState's layout: parameters, then buffers).
  const std::vector<float>& weights() const { return weights_; }
  int64_t round() const { return round_; }
  /// The unmasked integer sum of the last securely aggregated round (empty otherwise).
  const std::vector<uint64_t>& lastSecureSum() const { return lastSecureSum_; }

 private:
  RoundReport plainRound(const std::vector<int>& selected, RoundReport report);
  RoundReport secureRound(const std::vector<int>& selected, RoundReport report);
  void apply(const std::vector<double>& sum, double weight, int selected);
  void cleanUp(int64_t round);

  std::shared_ptr<comm::Store> store_;
  FederatedOptions options_;
  std::vector<float> weights_;
  int64_t round_ = 0;
  std::unique_ptr<RdpAccountant> accountant_;
  std::vector<uint64_t> lastSecureSum_;
};

/// Client host `index` of `processes`: hosts clients c with c % processes == index, each
/// training on its own `partition[c]` of `data` with `model` (one model shared in turn), reading
/// only those samples.
class ClientHost {
 public:
  ClientHost(std::shared_ptr<comm::Store> store, FederatedOptions options, int index, int processes,
             std::shared_ptr<nn::Module> model, std::shared_ptr<const data::Dataset> data,
             std::vector<std::vector<int64_t>> partition);
  /// Serves rounds until the server says stop; waits up to `idleTimeout` for each round.
  void serve(std::chrono::milliseconds idleTimeout);
  /// Serves one round (the first call also tells the server this host is ready); returns
  /// false when the server said stop.
  bool serveRound(std::chrono::milliseconds idleTimeout);
  /// Applies `transform` to each of this host's updates before it is sent (null: none): to
  /// simulate faulty or malicious clients against the server's checks, or to change updates
  /// (quantise, add noise) before they leave the host; under secureAgg, before masking.
  void setUpdateTransform(std::function<void(Update&)> transform) {
    transform_ = std::move(transform);
  }

 private:
  bool drops(int64_t round, int client) const;
  void plainRound(int64_t round, const std::vector<int>& mine, const std::vector<float>& global);
  void secureRound(int64_t round, const std::vector<int>& mine, const std::vector<int>& selected,
                   const std::vector<float>& global);

  std::shared_ptr<comm::Store> store_;
  FederatedOptions options_;
  int index_;
  int processes_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<const data::Dataset> data_;
  std::vector<std::vector<int64_t>> partition_;
  int64_t round_ = 0;
  std::function<void(Update&)> transform_;
};

}  // namespace kolo::parallel::fed
