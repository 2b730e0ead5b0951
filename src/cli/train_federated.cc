// `kolo train --strategy federated` (train_federated.h): maps the flags onto
// parallel::fed::FederatedOptions, splits Fashion-MNIST over the clients, and runs the server
// (rank 0: rounds, test accuracy, metrics, --save) or a client host (other ranks).
#include "cli/train_federated.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <CLI/CLI.hpp>

#include "cli/options.h"
#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/federated.h"
#include "kolo/precision.h"
#include "kolo/safetensors.h"
#include "kolo/settings.h"
#include "kolo/threads.h"
#include "kolo/train/evaluate.h"

namespace kolo::cli {
namespace {

using Clock = std::chrono::steady_clock;
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
  refuseReducerFlags(config, "--strategy federated");
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


std::shared_ptr<nn::Module> initialModel(const TrainConfig& config) {
  Generator generator(config.seed);
  std::shared_ptr<nn::Module> model = nn::makeModel(config.model, generator);
  if (!config.initPath.empty())
    checkpoint::loadSafetensorsInto(config.initPath, model->namedParameters());
  return model;
}

std::shared_ptr<fed::ClientHost> makeHost(const TrainConfig& config, const FederatedFlags& flags,
                                          const fed::FederatedOptions& options,
                                          std::shared_ptr<comm::Store> store, int index,
                                          int hosts) {
  auto train = loadTrainingSet(config);
  auto partition = fed::partitionClients(train->labels(), options.clients,
                                         fed::parsePartition(flags.partition), config.seed);
  return std::make_shared<fed::ClientHost>(std::move(store), options, index, hosts,
                                           initialModel(config), std::move(train),
                                           std::move(partition));
}

int serve(const TrainConfig& config, const fed::FederatedOptions& options,
          std::shared_ptr<comm::Store> store, int hosts, observe::Logger& logger) {
  const auto start = Clock::now();
  const data::FashionMnist test(config.dataDir, false);
  std::shared_ptr<nn::Module> model = initialModel(config);
  fed::FederatedServer server(store, options, fed::flattenParameters(*model));
  std::unique_ptr<observe::MetricsWriter> metrics;
  if (!config.metricsPath.empty())
    metrics = std::make_unique<observe::MetricsWriter>(config.metricsPath);
  const int ready = server.awaitHosts(hosts, options.roundTimeout * 2 + std::chrono::minutes(5));
  if (ready < hosts)
    logger.warn("not every client host is ready; starting without the others",
                {{"ready", ready}, {"hosts", hosts}});
  double accuracy = 0.0;
  int64_t bytesUp = 0, bytesDown = 0;
  for (int64_t r = 0; r < options.rounds; ++r) {
    const fed::RoundReport report = server.runRound();
    for (const std::string& why : report.refused) logger.warn(why, {{"round", report.round}});
    fed::loadParameters(*model, server.weights());
    accuracy = train::evaluate(*model, test).accuracy;
    bytesUp += report.bytesUp;
    bytesDown += report.bytesDown;
    observe::Fields fields{
        {"round", report.round},          {"clients", report.clients},
        {"dropped", report.dropped},      {"refused", static_cast<int64_t>(report.refused.size())},
        {"test_accuracy", accuracy},      {"bytes_up", report.bytesUp},
        {"bytes_down", report.bytesDown}, {"round_s", report.seconds}};
    if (report.epsilon >= 0.0) fields.set("epsilon", report.epsilon);
    if (metrics) metrics->write(fields);
    if (!config.quiet) {
      std::fprintf(
          stderr, "round %lld/%lld clients %d dropped %d test_accuracy %.4f%s (%.1f s)\n",
          static_cast<long long>(report.round), static_cast<long long>(options.rounds),
          report.clients, report.dropped, accuracy,
          report.epsilon >= 0.0 ? (" epsilon " + std::to_string(report.epsilon)).c_str() : "",
          report.seconds);
    }
  }
  server.finish();
  if (!config.savePath.empty()) {
    checkpoint::saveSafetensors(config.savePath, model->namedParameters());
    logger.info("saved weights", {{"file", config.savePath}});
  }
  std::printf(
      "test_accuracy %.4f rounds %lld clients %d hosts %d bytes_up %lld bytes_down %lld wall_s "
      "%.1f\n",
      accuracy, static_cast<long long>(options.rounds), options.clients, hosts,
      static_cast<long long>(bytesUp), static_cast<long long>(bytesDown),
      std::chrono::duration<double>(Clock::now() - start).count());
  std::fflush(stdout);
  return 0;
}

}  // namespace

std::shared_ptr<FederatedFlags> addFederatedOptions(CLI::App* app) {
  auto flags = std::make_shared<FederatedFlags>();
  const char* group = "Federated (--strategy federated)";
  app->add_option("--clients", flags->clients, "simulated clients")
      ->capture_default_str()
      ->check(atLeast(1))
      ->group(group);
  app->add_option("--clients-per-round", flags->clientsPerRound, "clients sampled each round (K)")
      ->check(atLeast(1))
      ->group(group);
  app->add_option("--client-fraction", flags->clientFraction,
                  "fraction of the clients sampled each round, without --clients-per-round")
      ->capture_default_str()
      ->check(above(0))
      ->group(group);
  app->add_option("--rounds", flags->rounds, "communication rounds")
      ->capture_default_str()
      ->check(atLeast(1))
      ->group(group);
  app->add_option("--local-epochs", flags->localEpochs, "epochs each client trains per round (E)")
      ->capture_default_str()
      ->check(atLeast(1))
      ->group(group);
  app->add_option("--local-batch", flags->localBatch,
                  "client batch size (B); 0: the client's whole data (FedSGD with E = 1)")
      ->capture_default_str()
      ->check(atLeast(0))
      ->group(group);
  app->add_option("--prox-mu", flags->proxMu, "FedProx proximal weight mu (--algorithm fedprox)")
      ->check(notBelow(0))
      ->group(group);
  app->add_option("--server-lr", flags->serverLr, "server step on the mean update")
      ->capture_default_str()
      ->check(above(0))
      ->group(group);
  app->add_option("--partition", flags->partition, "iid, shards:S or dirichlet:ALPHA")
      ->capture_default_str()
      ->group(group);
  app->add_option("--round-timeout", flags->roundTimeout,
                  "seconds the server waits for a round's updates; later ones are left out")
      ->capture_default_str()
      ->check(above(0))
      ->group(group);
  app->add_option("--debug-drop-rate", flags->debugDropRate,
                  "each selected client drops out with this probability, for tests")
      ->check(notBelow(0))
      ->group("");
  app->add_flag("--secure-agg", flags->secureAgg,
                "secure aggregation (Bonawitz et al. 2017): the server learns only the sum")
      ->group(group);
  app->add_option("--sa-threshold", flags->saThreshold,
                  "secure aggregation: shares needed to recover a dropped client's masks "
                  "(default: a majority of K)")
      ->check(atLeast(1))
      ->group(group);
  app->add_option("--dp-clip", flags->dpClip,
                  "DP-FedAvg: clip each client's update to this L2 norm")
      ->check(above(0))
      ->group(group);
  app->add_option("--dp-noise", flags->dpNoise,
                  "DP-FedAvg: Gaussian noise multiplier sigma (std sigma * clip on the sum)")
      ->check(notBelow(0))
      ->group(group);
  app->add_option("--dp-delta", flags->dpDelta, "DP-FedAvg: delta of the reported epsilon")
      ->capture_default_str()
      ->check(above(0))
      ->group(group);
  return flags;
}

int runFederated(const TrainConfig& config, const FederatedFlags& flags, observe::Logger& logger) {
  KOLO_REQUIRE(flags.debugDropRate <= 1.0, "--debug-drop-rate must be at most 1, got ",
               flags.debugDropRate);
  KOLO_REQUIRE(flags.dpDelta < 1.0, "--dp-delta must be below 1, got ", flags.dpDelta);
  fed::parsePartition(flags.partition);  // bad flags fail before the data is read
  const fed::FederatedOptions options = federatedOptions(config, flags);
  setNumThreads(config.threads);
  const comm::LaunchInfo launch = comm::detectLaunch();
  // Client hosts wait for the next round's plan while the server trains nothing: allow them
  // the server's whole round (every step of it, with secure aggregation) and an evaluation.
  const std::chrono::milliseconds idle = options.roundTimeout * 5 + std::chrono::minutes(5);
  if (launch.size <= 1) {
    // One process: the server here, one client host on a thread, over an in-memory store.
    auto store = comm::makeMemoryStore();
    std::shared_ptr<fed::ClientHost> host = makeHost(config, flags, options, store, 0, 1);
    auto hostError = std::make_shared<std::exception_ptr>();
    std::thread hostThread([host, hostError, idle, precision = matmulPrecision()] {
      const MatmulPrecisionGuard products(precision);  // the clients train on this thread
      try {
        host->serve(idle);
      } catch (...) {
        *hostError = std::current_exception();
      }
    });
    int status = 0;
    try {
      status = serve(config, options, store, 1, logger);
    } catch (...) {
      hostThread.detach();  // it holds what it uses; the error ends the process
      throw;
    }
    hostThread.join();
    if (*hostError) std::rethrow_exception(*hostError);
    return status;
  }
  // The job's store must outlive every client host's last read, which kolo run's launcher
  // guarantees (it serves the store until its ranks end); under srun or torchrun's variables
  // nobody would serve it, and every rank would wait out the store timeout to say so.
  KOLO_REQUIRE(launch.launcher == "kolo" && !launch.storeAddress.empty(),
               "--strategy federated under ", launch.launcher, " (rank ", launch.rank, " of ",
               launch.size,
               ") needs kolo run's store (KOLO_STORE): start it with kolo run -n N "
               "--tolerate-failures -- kolo train ...; under Slurm one launcher per node: srun "
               "--ntasks-per-node=1 kolo run -n G --tolerate-failures -- kolo train --strategy "
               "federated ...");
  const std::chrono::milliseconds storeTimeout =
      settings::timeout() ? seconds(*settings::timeout())
                          : std::chrono::milliseconds(std::chrono::minutes(5));
  auto store = comm::prefixStore(
      comm::connectTcpStore(launch.storeAddress, launch.token, storeTimeout), "kolo-federated/");
  if (launch.rank == 0) return serve(config, options, store, launch.size - 1, logger);
  std::shared_ptr<fed::ClientHost> host =
      makeHost(config, flags, options, store, launch.rank - 1, launch.size - 1);
  for (int64_t round = 1;; ++round) {
    // --fail-at-step ROUND:RANK: this client host fails before serving ROUND (for tests);
    // --debug-kill-rank RANK:ROUND: it is SIGKILLed there.
    killIfAsked(config, launch.rank, round);
    if (round == config.failStep && launch.rank == config.failRank)
      KOLO_THROW(Error, "injected failure of client host rank ", launch.rank, " before round ",
                 round);
    if (!host->serveRound(idle)) return 0;
  }
}

}  // namespace kolo::cli
