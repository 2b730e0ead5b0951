// train::trainFederated: the federated job's roles from the launch (the server on rank 0 or
// in the one process, client hosts elsewhere), the server's rounds with evaluation, metrics
// and progress lines, and a client host's loop.
#include "kolo/train/federated.h"

#include <cstdio>
#include <exception>
#include <thread>

#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/precision.h"
#include "kolo/train/evaluate.h"
#include "train/fit_plan.h"
#include "train/monitor.h"

namespace kolo::train {
namespace {

namespace fed = parallel::fed;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The options the rounds run with: `options.federated` with what RunOptions says (the
/// rounds from `steps`, the seed, the clients' shuffling). InvalidArgument, naming the option,
/// for what federated training does not read and for values that disagree.
fed::FederatedOptions federatedOptions(const FederatedTrainOptions& options) {
  detail::checkRunOptions(options, "FederatedTrainOptions");
  KOLO_REQUIRE(options.epochs == 0, "FederatedTrainOptions::epochs ", options.epochs,
               " is not read: federated training counts rounds (FederatedTrainOptions::steps) and "
               "each client's LocalTrainingOptions::localEpochs");
  KOLO_REQUIRE(options.batch == RunOptions{}.batch, "FederatedTrainOptions::batch ", options.batch,
               " is not read: a client trains on batches of LocalTrainingOptions::localBatch samples, "
               "and a round has no global batch");
  KOLO_REQUIRE(!options.schedule,
               "FederatedTrainOptions::schedule is not read: the clients train at LocalTrainingOptions::lr");
  KOLO_REQUIRE(options.checkpointDir.empty() && options.checkpointEvery == 0 && options.resumeDir.empty(),
               "FederatedTrainOptions::checkpointDir, checkpointEvery and resumeDir are not available: "
               "federated training keeps no checkpoints (the trained weights are FederatedSummary::model)");
  fed::FederatedOptions f = options.federated;
  if (options.steps > 0) {
    KOLO_REQUIRE(f.rounds == fed::FederatedOptions{}.rounds || f.rounds == options.steps,
                 "FederatedTrainOptions::steps ", options.steps, " and FederatedOptions::rounds ", f.rounds,
                 " disagree: a step is a round; set one of them");
    f.rounds = options.steps;
  }
  KOLO_REQUIRE(options.seed == 0 || f.seed == 0 || f.seed == options.seed, "FederatedTrainOptions::seed ",
               options.seed, " and FederatedOptions::seed ", f.seed, " disagree: set one of them");
  if (options.seed != 0) f.seed = options.seed;
  f.client.shuffle = f.client.shuffle && options.shuffle;
  fed::checkOptions(f);
  return f;
}

std::chrono::milliseconds idleTimeout(const FederatedTrainOptions& options) {
  if (options.idleTimeout.count() > 0) return options.idleTimeout;
  // The server's whole round (every step of it with secure aggregation) and an evaluation.
  return options.federated.roundTimeout * 5 + std::chrono::minutes(5);
}

observe::Fields roundFields(const FederatedRoundEnd& end) {
  const fed::RoundReport& r = end.report;
  observe::Fields fields{{"round", r.round},
                         {"clients", r.clients},
                         {"dropped", r.dropped},
                         {"refused", static_cast<int64_t>(r.refused.size())},
                         {"test_accuracy", end.validationAccuracy},
                         {"bytes_up", r.bytesUp},
                         {"bytes_down", r.bytesDown},
                         {"round_s", r.seconds}};
  if (r.epsilon >= 0.0) fields.set("epsilon", r.epsilon);
  return fields;
}

// Rank 0's part: the rounds, each evaluated, with a metrics line, a progress line and the
// status line (status rank 0).
FederatedSummary serve(const parallel::ModelFactory& makeModel, const data::Dataset* validation,
                       const FederatedTrainOptions& options, const fed::FederatedOptions& federated,
                       const FederatedCallbacks& callbacks, std::shared_ptr<comm::Store> store, int hosts) {
  const auto start = Clock::now();
  observe::Logger fallback(stderr);
  observe::Logger& logger = options.logger ? *options.logger : fallback;
  detail::RankStatus status(detail::statusFileOf(options.statusFile), 0, federated.rounds);
  FederatedSummary summary;
  summary.server = true;
  summary.hosts = hosts;
  summary.model = makeModel();
  fed::FederatedServer server(store, federated, fed::flattenState(*summary.model));
  std::unique_ptr<observe::MetricsWriter> metrics;
  if (!options.metricsPath.empty()) metrics = std::make_unique<observe::MetricsWriter>(options.metricsPath);
  observe::Fields describe = options.describe;
  describe.update({{"strategy", "federated"},
                   {"clients", federated.clients},
                   {"clients_per_round", federated.clientsPerRound},
                   {"rounds", federated.rounds},
                   {"hosts", hosts}});
  logger.info("training", describe);
  const int ready = server.awaitHosts(hosts, federated.roundTimeout * 2 + std::chrono::minutes(5));
  if (ready < hosts)
    logger.warn("not every client host is ready; starting without the others", {{"ready", ready}, {"hosts", hosts}});
  for (int64_t r = 0; r < federated.rounds; ++r) {
    status.update("training", r);
    FederatedRoundEnd end{.report = server.runRound()};
    for (const std::string& why : end.report.refused) logger.warn(why, {{"round", end.report.round}});
    fed::loadState(*summary.model, server.weights());
    if (validation) {
      status.update("evaluating", end.report.round);
      const EvaluateResult figures = evaluate(*summary.model, *validation);
      end.validationAccuracy = figures.accuracy;
      summary.validationLoss = figures.loss;
    }
    summary.validationAccuracy = end.validationAccuracy;
    summary.bytesUp += end.report.bytesUp;
    summary.bytesDown += end.report.bytesDown;
    summary.rounds = summary.steps = end.report.round;
    if (metrics) metrics->write(roundFields(end));
    if (!options.quiet) {
      const std::string epsilon =
          end.report.epsilon >= 0.0 ? " epsilon " + std::to_string(end.report.epsilon) : "";
      std::fprintf(stderr, "round %lld/%lld clients %d dropped %d test_accuracy %.4f%s (%.1f s)\n",
                   static_cast<long long>(end.report.round), static_cast<long long>(federated.rounds),
                   end.report.clients, end.report.dropped, end.validationAccuracy, epsilon.c_str(),
                   end.report.seconds);
    }
    status.update("training", end.report.round, summary.validationLoss, end.report.seconds);
    if (callbacks.onRoundEnd) callbacks.onRoundEnd(end);
  }
  server.finish();
  summary.wallSeconds = secondsSince(start);
  return summary;
}

std::shared_ptr<fed::ClientHost> makeHost(const parallel::ModelFactory& makeModel,
                                          std::shared_ptr<const data::Dataset> train,
                                          const FederatedTrainOptions& options,
                                          const fed::FederatedOptions& federated,
                                          std::shared_ptr<comm::Store> store, int index, int hosts) {
  auto partition = fed::partitionClients(*train, federated.clients, options.partition, federated.seed);
  return std::make_shared<fed::ClientHost>(std::move(store), federated, index, hosts, makeModel(),
                                           std::move(train), std::move(partition));
}

}  // namespace

FederatedSummary trainFederated(parallel::ModelFactory model, std::shared_ptr<const data::Dataset> train,
                                std::shared_ptr<const data::Dataset> validation,
                                const FederatedTrainOptions& options, const FederatedCallbacks& callbacks) {
  KOLO_REQUIRE(train != nullptr, "train::trainFederated: no training dataset");
  const fed::FederatedOptions federated = federatedOptions(options);
  if (federated.dpClip > 0.0) {
    // DP-FedAvg bounds what one client changes in the model by clipping its update; a batch
    // norm's running statistics are computed from the client's samples as well, would be
    // clipped and noised as if they were weights, and leak the batch statistics besides
    // (Opacus refuses batch norm for the same reason).
    const auto buffers = model()->namedBuffers();
    KOLO_REQUIRE(
        buffers.empty(),
        "train::trainFederated: FederatedOptions::dpClip is set and the model has buffers (",
        buffers.front().first,
        ", ...: a batch norm's running statistics), which differential privacy does not cover: use "
        "a "
        "model without batch norm (e.g. group or layer norm)");
  }
  keepFreedMemory();  // each local step reuses the buffers the last one freed
  const std::chrono::milliseconds idle = idleTimeout(options);
  const comm::LaunchInfo launch = comm::detectLaunch();
  if (launch.size <= 1) {
    // One process: the server here, one client host on a thread, over an in-memory store.
    auto store = comm::makeMemoryStore();
    std::shared_ptr<fed::ClientHost> host = makeHost(model, train, options, federated, store, 0, 1);
    auto hostError = std::make_shared<std::exception_ptr>();
    std::thread hostThread([host, hostError, idle, beforeRound = callbacks.beforeRound,
                            precision = matmulPrecision()] {
      const MatmulPrecisionGuard products(precision);  // the clients train on this thread
      try {
        for (int64_t round = 1;; ++round) {
          if (beforeRound) beforeRound(round);
          if (!host->serveRound(idle)) return;
        }
      } catch (...) {
        *hostError = std::current_exception();
      }
    });
    FederatedSummary summary;
    try {
      summary = serve(model, validation.get(), options, federated, callbacks, store, 1);
    } catch (...) {
      hostThread.detach();  // it holds what it uses; the error ends the caller's run
      throw;
    }
    hostThread.join();
    if (*hostError) std::rethrow_exception(*hostError);
    return summary;
  }
  // The job's store must outlive every client host's last read, which kolo run's launcher
  // guarantees (it serves the store until its ranks end); under srun or torchrun's variables
  // nobody would serve it, and every rank would wait out the store timeout to say so.
  KOLO_REQUIRE(launch.launcher == "kolo" && !launch.storeAddress.empty(), "trainFederated under ",
               launch.launcher, " (rank ", launch.rank, " of ", launch.size,
               ") needs the store of kolo's launcher (KOLO_STORE), served until every rank has ended: "
               "start it with kolo's launcher of a job that tolerates failures; under Slurm, one such "
               "launcher per node (srun --ntasks-per-node=1)");
  auto store = comm::prefixStore(comm::connectTcpStore(launch.storeAddress, launch.token, options.storeTimeout),
                                 "kolo-federated/");
  if (launch.rank == 0)
    return serve(model, validation.get(), options, federated, callbacks, store, launch.size - 1);
  std::shared_ptr<fed::ClientHost> host =
      makeHost(model, train, options, federated, store, launch.rank - 1, launch.size - 1);
  // A client host's status line: the rounds it served.
  detail::RankStatus status(detail::statusFileOf(options.statusFile), launch.rank, federated.rounds);
  const auto start = Clock::now();
  FederatedSummary summary;
  summary.hosts = launch.size - 1;
  for (int64_t round = 1;; ++round) {
    if (callbacks.beforeRound) callbacks.beforeRound(round);
    status.update("training", round - 1);
    if (!host->serveRound(idle)) break;
    summary.rounds = summary.steps = round;
  }
  status.update("training", summary.rounds);
  summary.wallSeconds = secondsSince(start);
  return summary;
}

}  // namespace kolo::train
