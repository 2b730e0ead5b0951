// `kolo train --strategy federated` (runFederated, train_loop.h): the flags mapped onto
// train::trainFederated (the server on rank 0, client hosts elsewhere), then --save and the
// summary line. Any --data kolo train reads: each client gathers only its own samples of it.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli/train_loop.h"
#include "kolo/comm/init.h"
#include "kolo/parallel/federated.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/federated.h"

namespace kolo::cli {

int runFederated(const TrainConfig& config, observe::Logger& logger) {
  namespace fed = parallel::fed;
  KOLO_REQUIRE(config.model == "mlp" || config.model == "cnn" || config.model == "resnet",
               "--model '", config.model, "' is not accepted: use mlp, cnn or resnet");
  KOLO_REQUIRE(!config.optimizer || *config.optimizer == "sgd",
               "--strategy federated trains the clients with plain SGD: --optimizer ",
               config.optimizer.value_or(""), " is not available");
  KOLO_REQUIRE(
      !config.momentum || *config.momentum == 0.0,
      "--strategy federated trains the clients with plain SGD: --momentum is not available");
  KOLO_REQUIRE(!config.epochs && config.steps == 0,
               "--strategy federated counts --rounds and --local-epochs, not --epochs or --steps");
  KOLO_REQUIRE(config.checkpointDir.empty() && config.resumeDir.empty(),
               "--checkpoint-dir and --resume are not available with --strategy federated");
  train::FederatedTrainOptions options;
  options.partition = fed::parsePartition(config.partition);
  fed::FederatedOptions& f = options.federated = config.federated;
  f.rounds = config.rounds;
  if (!config.givenFlags.count("--clients-per-round"))
    f.clientsPerRound = std::max(1, static_cast<int>(std::lround(config.clientFraction * f.clients)));
  f.client.lr = config.lr.value_or(0.05);
  f.client.method = fed::parseMethod(config.algorithm == "auto" ? "fedavg" : config.algorithm);
  fed::checkOptions(f);  // bad flags fail before the data is read
  // The options every trainer reads alike; the rounds are --rounds (federated.rounds).
  options.seed = config.seed;
  options.shuffle = config.shuffle;
  options.metricsPath = config.metricsPath;
  options.quiet = config.quiet;
  options.statusFile = config.statusFile;
  options.logger = &logger;
  options.describe = {{"model", config.model}, {"lr", f.client.lr}};
  if (const auto seconds = settings::timeout())
    options.storeTimeout = std::chrono::milliseconds(static_cast<int64_t>(*seconds * 1000));
  setNumThreads(config.threads);
  const comm::LaunchInfo launch = comm::detectLaunch();
  train::FederatedCallbacks callbacks;
  // --fail-at-step ROUND:RANK: that client host fails before serving ROUND (for tests);
  // --debug-kill-rank RANK:ROUND: it is SIGKILLed there.
  callbacks.beforeRound = [&config, rank = launch.rank](int64_t round) { config.faults.strike(rank, round, "round"); };
  // The clients read their own samples of the training split, whatever --data is (a table,
  // arrays, images, shards): the built-in model's sizes follow the data.
  TrainConfig sized = config;
  const data::TrainingData sets = loadDatasets(sized, logger);
  auto model = [&sized]() -> std::shared_ptr<nn::Module> { return buildModel(sized); };
  const train::FederatedSummary summary = train::trainFederated(model, sets.train, sets.validation, options, callbacks);
  if (!summary.server) return 0;
  saveWeights(sized, *summary.model, summary.rounds, logger);
  std::printf(
      "test_accuracy %.4f rounds %lld clients %d hosts %d bytes_up %lld bytes_down %lld wall_s "
      "%.1f\n",
      summary.validationAccuracy, static_cast<long long>(summary.rounds), options.federated.clients,
      summary.hosts, static_cast<long long>(summary.bytesUp), static_cast<long long>(summary.bytesDown),
      summary.wallSeconds);
  std::fflush(stdout);
  return 0;
}

}  // namespace kolo::cli
