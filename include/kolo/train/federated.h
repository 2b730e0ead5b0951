// The federated engine of the train layer: what a user's own program calls to train its own
// model with FedAvg or FedProx over simulated clients, in one process or in a job started by
// `kolo run -n N` (rank 0 serves, the other ranks host the clients), in the manner of
// Flower's simulation or TensorFlow Federated's iterative process. Every process calls
// trainFederated() with the same arguments; the library picks its role from the launch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/data.h"
#include "kolo/nn/module.h"
#include "kolo/observe.h"
#include "kolo/parallel/federated.h"
#include "kolo/parallel/strategy.h"
#include "kolo/train/fit.h"
#include "kolo/train/run_options.h"

namespace kolo::train {

/// How a federated job trains: the options every trainer reads (RunOptions), in fit's words,
/// and federated training's own. A step is one round: the server's one update from the
/// clients' mean change. What of RunOptions it reads:
/// - `steps`: the rounds (0: federated.rounds; both set, they must agree);
/// - `seed`: the clients' split, each round's clients and the clients' shuffling (it sets
///   federated.seed, which must be left 0 or equal); `shuffle`: whether the clients reshuffle
///   their samples each local epoch (it sets federated.client.shuffle);
/// - `metricsPath`: the server's metrics, one JSON line per round (round, clients, dropped,
///   refused, test_accuracy, bytes_up, bytes_down, round_s, epsilon with DP);
/// - `quiet`: hides the server's line per round on stderr ("round r/R clients ...
///   test_accuracy ..."); log lines ("training", warnings) still go to `logger`;
/// - `statusFile`: each process's line (the server rank 0, client host h rank h + 1), its
///   rounds as the step; `logger` and `describe` (the "training" line's further fields).
/// The rest is refused (InvalidArgument naming it) rather than ignored: `epochs` and `batch`
/// (a client trains federated.client.localEpochs epochs of federated.client.localBatch
/// samples; there is no global batch), `schedule` (the clients' rate is
/// federated.client.lr), and checkpoints and resume (`checkpointDir`, `checkpointEvery`,
/// `resumeDir`: the trained weights are FederatedSummary::model).
struct FederatedTrainOptions : RunOptions {
  /// Clients, clients per round, rounds, local training (epochs, batch, lr, FedAvg/FedProx),
  /// server rate, round timeout, secure aggregation, DP-FedAvg, simulated drop-outs.
  parallel::fed::FederatedOptions federated{};
  /// How the training set is split over the clients (by its labels), seeded by `seed`.
  parallel::fed::PartitionSpec partition{};
  /// How long to reach the job's store, and how long a client host waits for the next round
  /// (default: five round timeouts and five minutes, the server's whole round and an
  /// evaluation).
  std::chrono::milliseconds storeTimeout{std::chrono::minutes(5)};
  std::chrono::milliseconds idleTimeout{0};
};

/// What a round ended with, on the server (FederatedCallbacks::onRoundEnd).
struct FederatedRoundEnd {
  parallel::fed::RoundReport report{};
  double validationAccuracy = 0.0;  // 0 without a validation set
};

struct FederatedCallbacks {
  /// On a client host before it serves round `round` (1-based): a test fails or kills a host
  /// here.
  std::function<void(int64_t round)> beforeRound{};
  /// On the server after each round's evaluation.
  std::function<void(const FederatedRoundEnd&)> onRoundEnd{};
};

/// What a federated job ends with: fit's figures (FitSummary; on the server `model`, the
/// global model after the last round, built by the model factory, and the validation
/// accuracy and loss after it; `steps`, the server's updates, one a round; the wall seconds)
/// and federated training's own.
struct FederatedSummary : FitSummary {
  bool server = false;  // this process served (rank 0, or the one process)
  int64_t rounds = 0;   // rounds done (= steps)
  int hosts = 0;        // client host processes (1 in one process)
  int64_t bytesUp = 0, bytesDown = 0;
};

/// Trains `model` (built by every process, seeded alike) federatedly on `train` split over
/// the clients by index (parallel::fed::partitionClients), evaluating the global model on
/// `validation` (may be null) after each round. `train` may be any dataset, in memory or not:
/// a client gathers only its own samples, a batch at a time, and a label-skewed partition reads
/// the labels a chunk at a time, so the set is never gathered whole.
/// One process: the server and one client host (a thread) over an in-memory store. Under
/// `kolo run -n N`: rank 0 serves, ranks 1..N-1 host the clients (client c on host c mod
/// N-1) over the job's store; the launcher must keep serving the store to the end (kolo's
/// does), so a job without one (KOLO_STORE) is refused. Blocking until the
/// last round; collective over the job's processes. Throws InvalidArgument for bad options
/// (naming the option, FederatedTrainOptions::steps or FederatedOptions::clients),
/// what the server's store throws when the job's store is gone, and a client host's
/// exception (its model, its data); a client host that vanishes only leaves its clients out
/// of the rounds.
FederatedSummary trainFederated(parallel::ModelFactory model,
                                std::shared_ptr<const data::Dataset> train,
                                std::shared_ptr<const data::Dataset> validation,
                                const FederatedTrainOptions& options,
                                const FederatedCallbacks& callbacks = {});

}  // namespace kolo::train
