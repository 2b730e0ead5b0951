// `kolo train --strategy federated`: the run of one process of a federated job (server on
// rank 0, client hosts on the other ranks).
#pragma once

#include <memory>
#include <string>

#include "cli/train_loop.h"

namespace kolo::cli {

/// Runs this process's part of a federated job: without `kolo run` (or with -n 1), the server
/// and one client host as threads over an in-memory store; under `kolo run -n N`, rank 0 is
/// the server and ranks 1..N-1 host the clients, over the job's TCP store. The server writes
/// --metrics (one line per round), --save, and the summary line; returns the exit status.
int runFederated(const TrainConfig& config, const FederatedFlags& flags, observe::Logger& logger);

}  // namespace kolo::cli
