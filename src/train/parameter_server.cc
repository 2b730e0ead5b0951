// trainParameterServer: reads the process's role from the environment, derives what every
// role computes alike (the model, the placement, the run's length and schedule), joins the
// job's store (hosting it on server 0 under mpirun/srun, where none was given) and runs the
// role: the server here, the worker and the chief in files of their own.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/token.h"
#include "parallel/ps/store_keys.h"
#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/train/parameter_server.h"
#include "train/fit_plan.h"
#include "train/parameter_server_roles.h"

namespace kolo::train {
namespace {

namespace ps = parallel::ps;

void checkOptions(const ParameterServerOptions& options) {
  KOLO_REQUIRE(options.batch >= 1, "ParameterServerOptions::batch must be at least 1, got ", options.batch);
  detail::checkRunOptions(options, "ParameterServerOptions");
  KOLO_REQUIRE(options.unitBatches >= 1, "ParameterServerOptions::unitBatches must be at least 1, got ",
               options.unitBatches);
  KOLO_REQUIRE(options.shardBytes >= 1, "ParameterServerOptions::shardBytes must be at least 1, got ",
               options.shardBytes);
  KOLO_REQUIRE(options.lookahead >= 0.0, "ParameterServerOptions::lookahead must be at least 0, got ",
               options.lookahead);
  KOLO_REQUIRE(options.heartbeat.count() >= 0, "ParameterServerOptions::heartbeat must be at least 0");
  KOLO_REQUIRE(options.mode != ps::Mode::Sync || !options.overlap.value_or(false),
               "ParameterServerOptions::overlap on is not available with ParameterServerOptions::mode "
               "sync: a round's mean must be of gradients computed on the same parameters");
  KOLO_REQUIRE((options.mode != ps::Mode::Sync && options.overlap.value_or(true)) ||
                   options.lookahead == 0.0,
               "ParameterServerOptions::lookahead needs the exchange overlapped "
               "(ParameterServerOptions::overlap, async and ssp)");
}

/// The run's length: `epochs` epochs of floor(samples / batch) steps, fit's, cut short by
/// `steps` (server updates: a push of `batch` samples each in async and ssp, a round of W
/// pushes of batch / W samples in sync).
void planLength(detail::PsJob& job, const ParameterServerOptions& options) {
  const int64_t workers = job.role.workers;
  const bool sync = options.mode == ps::Mode::Sync;
  KOLO_REQUIRE(!sync || options.batch % workers == 0, "ParameterServerOptions::batch ",
               options.batch, " does not split evenly over ", workers,
               " workers: a sync step is one batch of batch / W samples from each worker; use a "
               "multiple of ", workers);
  job.stepsPerEpoch = job.trainSize / options.batch;
  KOLO_REQUIRE(job.stepsPerEpoch > 0, "ParameterServerOptions::batch ", options.batch,
               " is larger than the training set's ", job.trainSize, " samples");
  const int64_t batchesPerStep = sync ? workers : 1;
  job.workerBatch = options.batch / batchesPerStep;
  job.batchesPerEpoch = job.stepsPerEpoch * batchesPerStep;
  const int64_t epochs = std::max<int64_t>(options.epochs, 1);
  int64_t batches = epochs * job.batchesPerEpoch;
  job.totalSteps = epochs * job.stepsPerEpoch;
  if (options.steps > 0 && (options.epochs == 0 || options.steps < job.totalSteps)) {
    job.totalSteps = options.steps;
    batches = options.steps * batchesPerStep;
  }
  job.epochs = (batches + job.batchesPerEpoch - 1) / job.batchesPerEpoch;
  const int64_t lastBatches = batches - (job.epochs - 1) * job.batchesPerEpoch;
  job.lastEpochSamples = lastBatches < job.batchesPerEpoch ? lastBatches * job.workerBatch : 0;
}

detail::PsJob planJob(const parallel::ModelFactory& makeModel,
                      const parallel::OptimizerFactory& makeOptimizer, int64_t trainSize,
                      const ParameterServerOptions& options) {
  detail::PsJob job;
  job.role = options.role ? *options.role : ps::roleFromEnvironment();
  job.trainSize = trainSize;
  job.timeout = options.timeout;
  planLength(job, options);
  job.model = makeModel();
  KOLO_REQUIRE(job.model != nullptr, "trainParameterServer: the model factory returned no model");
  job.parameters = job.model->namedParameters();
  // Without a schedule, the optimizer's own rate throughout (the chief records it).
  std::unique_ptr<optim::LrSchedule> schedule =
      options.schedule ? options.schedule(job.totalSteps, job.stepsPerEpoch)
                       : std::make_unique<optim::ConstantLr>(makeOptimizer(job.parameters)->lr());
  KOLO_REQUIRE(schedule != nullptr, "trainParameterServer: the schedule factory returned none");
  job.schedule = std::move(schedule);
  job.placement = ps::placeParameters(job.parameters, job.role.servers, options.shardBytes);
  return job;
}

/// A store for a job that was started without one (mpirun, srun): rank 0 (server 0) hosts it
/// with a fresh token and tells every rank where it is through one broadcast over the job's
/// communicator. Returns the hosted server on rank 0 (it must outlive the job's start).
std::unique_ptr<comm::TcpStoreServer> bootstrapStore(detail::PsJob& job) {
  const std::shared_ptr<comm::Communicator> communicator =
      comm::initFromEnvironment({.timeout = job.timeout});
  std::unique_ptr<comm::TcpStoreServer> hosted;
  // Whether every rank runs on rank 0's host, from the host names themselves: the launchers'
  // local sizes cannot tell (a PyTorchJob's pods set RANK and WORLD_SIZE but no
  // LOCAL_WORLD_SIZE, which reads as one host). Only then may the store listen on loopback.
  char host[256] = {}, rootHost[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::memcpy(rootHost, host, sizeof host);
  communicator->broadcast(rootHost, sizeof rootHost, DType::U8, 0);
  const int32_t away = std::strcmp(host, rootHost) != 0 ? 1 : 0;
  int32_t ranksAway = 0;
  communicator->allreduce(&away, &ranksAway, 1, DType::I32, comm::ReduceOp::Sum);
  job.role.local = ranksAway == 0;
  char text[512] = {};
  if (communicator->rank() == 0) {
    const std::string token = comm::detail::randomToken(16);  // 128 bits as 32 hex digits
    hosted = std::make_unique<comm::TcpStoreServer>(
        comm::TcpStoreServerOptions{.host = job.role.local ? "127.0.0.1" : "", .token = token});
    // Elsewhere the others reach this host by its name (a pod's, which its service resolves).
    const std::string published = job.role.local ? "127.0.0.1" : host;
    std::snprintf(text, sizeof text, "%s %s",
                  comm::HostPort{published, hosted->port()}.toString().c_str(), token.c_str());
  }
  communicator->broadcast(text, sizeof text, DType::U8, 0);
  const std::string reply(text);
  const size_t space = reply.find(' ');
  KOLO_CHECK(space != std::string::npos, "store address from rank 0: '", reply, "'");
  job.role.store = reply.substr(0, space);
  job.role.token = reply.substr(space + 1);
  return hosted;
}

/// A server's status line after `updates` updates: "serving", and the epoch they reached.
void showServing(detail::RankStatus& status, const detail::PsJob& job, int64_t updates) {
  status.setEpoch(std::min(updates / job.stepsPerEpoch + 1, job.epochs));
  status.update("serving", updates);
}

/// Keeps a server's status line while it serves (serve() blocks, so on a thread of its own):
/// "serving", its updates as the step, every half second until destroyed; an error writing
/// the line is rethrown by rethrow().
class ServingStatus {
 public:
  ServingStatus(detail::RankStatus& status, const ps::ParameterServer& server, const detail::PsJob& job) {
    if (!status.kept()) return;
    // The first line before any worker can push: a reader sees "serving" from the start.
    showServing(status, job, server.stats().updates);
    watch_ = std::thread([this, &status, &server, &job] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return served_; })) {
        try {
          showServing(status, job, server.stats().updates);
        } catch (...) {
          error_ = std::current_exception();
          return;
        }
      }
    });
  }
  ~ServingStatus() { stop(); }
  ServingStatus(const ServingStatus&) = delete;
  ServingStatus& operator=(const ServingStatus&) = delete;

  /// Stops the thread; rethrows what it failed with.
  void rethrow() {
    stop();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      served_ = true;
    }
    wake_.notify_all();
    if (watch_.joinable()) watch_.join();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool served_ = false;
  std::exception_ptr error_;
  std::thread watch_;
};

ParameterServerSummary runServer(const detail::PsJob& job, comm::Store& store,
                                 const parallel::OptimizerFactory& makeOptimizer,
                                 const ParameterServerOptions& options, detail::RankStatus& status) {
  ps::ServerOptions server;
  server.index = job.role.index;
  server.workers = job.role.workers;
  server.mode = options.mode;
  server.staleness = options.staleness;
  server.stalenessLr = options.stalenessLr.value_or(options.mode != ps::Mode::Sync);
  server.token = job.role.token;
  server.host = ps::localHost(store);
  server.timeout = job.timeout;
  ps::ParameterServer instance(
      server, job.placement, job.parameters, makeOptimizer,
      [schedule = job.schedule](int64_t update) { return schedule->lrAt(update); });
  store.setString(ps::serverAddressKey(job.role.index),
                  comm::HostPort{server.host, instance.port()}.toString());
  ServingStatus serving(status, instance, job);
  instance.serve();
  serving.rethrow();
  const ps::ServerStats stats = instance.stats();
  showServing(status, job, stats.updates);
  ParameterServerSummary summary;
  summary.role = ps::Role::Server;
  summary.index = job.role.index;
  summary.steps = stats.updates;
  summary.stalenessMax = stats.stalenessMax;
  return summary;
}

}  // namespace

ParameterServerCallbacks injectWorkerFaults(const FaultPlan& plan, int rank) {
  ParameterServerCallbacks callbacks;
  callbacks.beforePush = [plan, rank](const WorkerPush& push) {
    if (push.worker == plan.slow.rank)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(push.seconds * (plan.slow.factor - 1.0)));
    plan.strike(rank, push.push, "push");
  };
  return callbacks;
}

namespace detail {

int launchRank(const ps::RoleInfo& role) {
  switch (role.role) {
    case ps::Role::Server: return role.index;
    case ps::Role::Chief: return role.servers;
    case ps::Role::Worker: return role.servers + 1 + role.index;
  }
  return -1;
}

std::vector<std::string> serverAddresses(comm::Store& store, const PsJob& job) {
  std::vector<std::string> addresses;
  for (int s = 0; s < job.role.servers; ++s)
    addresses.push_back(store.getString(ps::serverAddressKey(s), job.timeout));
  return addresses;
}

bool jobFinished(comm::Store& store) {
  try {
    return store.check({ps::finishedKey()});
  } catch (const Error&) {
    return false;
  }
}

}  // namespace detail

ParameterServerSummary trainParameterServer(parallel::ModelFactory model,
                                            parallel::OptimizerFactory optimizer,
                                            const ParameterServerData& data,
                                            const ParameterServerOptions& options,
                                            const ParameterServerCallbacks& callbacks) {
  KOLO_REQUIRE(model != nullptr, "trainParameterServer: no model factory");
  KOLO_REQUIRE(optimizer != nullptr, "trainParameterServer: no optimizer factory");
  KOLO_REQUIRE(data.train != nullptr, "trainParameterServer: no training set");
  checkOptions(options);
  keepFreedMemory();  // each step reuses the buffers the last one freed
  observe::Logger stderrLogger(stderr);
  observe::Logger& logger = options.logger ? *options.logger : stderrLogger;
  // Only workers read training samples; the servers and the chief need their number.
  const ps::Role role = options.role ? options.role->role : ps::roleFromEnvironment().role;
  std::shared_ptr<const data::Dataset> train;
  if (role == ps::Role::Worker || data.trainSize < 0) {
    train = data.train();
    KOLO_REQUIRE(train != nullptr, "trainParameterServer: the training set's loader returned none");
  }
  const int64_t trainSize = data.trainSize >= 0 ? data.trainSize : train->size();
  detail::PsJob job = planJob(model, optimizer, trainSize, options);
  const std::unique_ptr<comm::TcpStoreServer> hostedStore =
      job.role.store.empty() ? bootstrapStore(job) : nullptr;
  const std::shared_ptr<comm::Store> store =
      comm::connectTcpStore(job.role.store, job.role.token, job.timeout);
  // Each role keeps its line as fit's ranks do (done, or failed on an exception, at the end).
  detail::RankStatus status(detail::statusFileOf(options.statusFile), detail::launchRank(job.role),
                            job.totalSteps);
  switch (job.role.role) {
    case ps::Role::Server:
      return runServer(job, *store, optimizer, options, status);
    case ps::Role::Worker:
      return detail::runWorker(job, *store, model, *train, options, callbacks, logger, status);
    case ps::Role::Chief:
      return detail::runChief(job, *store, data.validation ? data.validation() : nullptr, options,
                              callbacks, logger, status);
  }
  KOLO_CHECK(false, "unknown parameter-server role");
  return {};
}

ParameterServerSummary trainParameterServer(parallel::ModelFactory model,
                                            parallel::OptimizerFactory optimizer,
                                            std::shared_ptr<const data::Dataset> train,
                                            std::shared_ptr<const data::Dataset> validation,
                                            const ParameterServerOptions& options,
                                            const ParameterServerCallbacks& callbacks) {
  KOLO_REQUIRE(train != nullptr, "trainParameterServer: no training set");
  ParameterServerData data{.train = [train] { return train; }, .trainSize = train->size()};
  if (validation) data.validation = [validation] { return validation; };
  return trainParameterServer(std::move(model), std::move(optimizer), data, options, callbacks);
}

}  // namespace kolo::train
