// `kolo train --strategy federated` (train_federated.h): maps the flags onto
// train::trainFederated (the server on rank 0, client hosts elsewhere), then --save and the
// summary line.
#include "cli/train_federated.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "kolo/comm/init.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/federated.h"
#include "kolo/safetensors.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/federated.h"

namespace kolo::cli {
namespace {

namespace fed = parallel::fed;

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

fed::FederatedOptions federatedOptions(const TrainConfig& config, const FederatedFlags& flags) {
  KOLO_REQUIRE(config.model == "mlp" || config.model == "cnn", "--model '", config.model,
               "' is not accepted: use mlp or cnn");
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
  const std::string algorithm = config.algorithm == "auto" ? "fedavg" : config.algorithm;
  fed::FederatedOptions options;
  options.clients = flags.clients;
  options.clientsPerRound =
      flags.clientsPerRound > 0
          ? flags.clientsPerRound
          : std::max(1, static_cast<int>(std::lround(flags.clientFraction * flags.clients)));
  KOLO_REQUIRE(options.clientsPerRound <= options.clients, "--clients-per-round ",
               options.clientsPerRound, " is more than the ", options.clients, " clients");
  options.rounds = flags.rounds;
  options.client.localEpochs = flags.localEpochs;
  options.client.localBatch = flags.localBatch;
  options.client.lr = config.lr.value_or(0.05);
  options.client.method = fed::parseMethod(algorithm);
  options.client.proxMu = flags.proxMu;
  KOLO_REQUIRE(options.client.method == fed::Method::FedProx || flags.proxMu == 0.0,
               "--prox-mu applies to --algorithm fedprox only");
  options.client.shuffle = config.shuffle;
  options.serverLr = flags.serverLr;
  options.roundTimeout = seconds(flags.roundTimeout);
  options.simulatedDropRate = flags.debugDropRate;
  options.secureAgg = flags.secureAgg;
  options.saThreshold = flags.saThreshold;
  KOLO_REQUIRE(flags.saThreshold == 0 || flags.secureAgg,
               "--sa-threshold applies to --secure-agg only");
  options.dpClip = flags.dpClip;
  options.dpNoise = flags.dpNoise;
  options.dpDelta = flags.dpDelta;
  KOLO_REQUIRE(flags.dpNoise == 0.0 || flags.dpClip > 0.0, "--dp-noise needs --dp-clip");
  options.seed = config.seed;
  return options;
}


}  // namespace

int runFederated(const TrainConfig& config, const FederatedFlags& flags, observe::Logger& logger) {
  KOLO_REQUIRE(flags.debugDropRate <= 1.0, "--debug-drop-rate must be at most 1, got ",
               flags.debugDropRate);
  KOLO_REQUIRE(flags.dpDelta < 1.0, "--dp-delta must be below 1, got ", flags.dpDelta);
  train::FederatedTrainOptions options;
  options.partition = fed::parsePartition(flags.partition);  // bad flags fail before the data is read
  options.federated = federatedOptions(config, flags);
  options.metricsPath = config.metricsPath;
  options.quiet = config.quiet;
  options.logger = &logger;
  if (settings::timeout()) options.storeTimeout = seconds(*settings::timeout());
  setNumThreads(config.threads);
  const comm::LaunchInfo launch = comm::detectLaunch();
  train::FederatedCallbacks callbacks;
  // --fail-at-step ROUND:RANK: that client host fails before serving ROUND (for tests);
  // --debug-kill-rank RANK:ROUND: it is SIGKILLed there.
  callbacks.beforeRound = [&config, rank = launch.rank](int64_t round) { config.faults.strike(rank, round, "round"); };
  auto model = [&config]() -> std::shared_ptr<nn::Module> {
    Generator generator(config.seed);
    std::shared_ptr<nn::Module> built = nn::makeModel(config.model, generator);
    if (!config.initPath.empty()) checkpoint::loadSafetensorsInto(config.initPath, built->namedParameters());
    return built;
  };
  const bool server = launch.size <= 1 || launch.rank == 0;
  std::shared_ptr<const data::TensorDataset> train = loadTrainingSet(config);
  std::shared_ptr<const data::Dataset> test;
  if (server) test = std::make_shared<data::FashionMnist>(config.dataDir, false);
  const train::FederatedSummary summary = train::trainFederated(model, train, test, options, callbacks);
  if (!summary.server) return 0;
  if (!config.savePath.empty()) {
    checkpoint::saveSafetensors(config.savePath, summary.model->namedParameters());
    logger.info("saved weights", {{"file", config.savePath}});
  }
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
