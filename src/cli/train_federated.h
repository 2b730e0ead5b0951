// `kolo train --strategy federated`: the federated flags of `kolo train` and the run of one
// process of a federated job (server on rank 0, client hosts on the other ranks).
#pragma once

#include <memory>
#include <string>

#include "cli/train_loop.h"

// CLI11 is heavy to parse: only the command files that build options include it.
namespace CLI {
class App;
}  // namespace CLI

namespace kolo::cli {

/// The flags only a federated run reads.
struct FederatedFlags {
  int clients = 100;
  int clientsPerRound = 0;      // 0: from clientFraction
  double clientFraction = 0.1;  // used when clientsPerRound is 0
  int64_t rounds = 50;
  int64_t localEpochs = 1;
  int64_t localBatch = 10;  // 0: the client's whole data
  double proxMu = 0.0;
  double serverLr = 1.0;
  std::string partition = "iid";
  double roundTimeout = 120;  // seconds
  double debugDropRate = 0.0;
  bool secureAgg = false;
  int saThreshold = 0;
  double dpClip = 0.0;
  double dpNoise = 0.0;
  double dpDelta = 1e-5;
};

/// Registers the federated flags on `app` (the `kolo train` subcommand).
std::shared_ptr<FederatedFlags> addFederatedOptions(CLI::App* app);

/// Runs this process's part of a federated job: without `kolo run` (or with -n 1), the server
/// and one client host as threads over an in-memory store; under `kolo run -n N`, rank 0 is
/// the server and ranks 1..N-1 host the clients, over the job's TCP store. The server writes
/// --metrics (one line per round), --save, and the summary line; returns the exit status.
int runFederated(const TrainConfig& config, const FederatedFlags& flags, observe::Logger& logger);

}  // namespace kolo::cli
