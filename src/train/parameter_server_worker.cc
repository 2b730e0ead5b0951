// A parameter-server worker's loop: it asks the chief for a unit of data at a time, computes
// a gradient per batch and pushes it, taking back the values to compute on next
// (parallel::ps::WorkerExchange, overlapped with the next batch's compute where asked).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "parallel/ps/store_keys.h"
#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/ops.h"
#include "train/parameter_server_roles.h"

namespace kolo::train::detail {
namespace {

using Clock = std::chrono::steady_clock;
namespace ps = parallel::ps;

/// Whether the worker overlaps its exchange with the next step's compute: as asked, or by
/// default in async and ssp when some server is reached over TCP.
/// Overlap hides the network's time behind the next step; through shared memory on the
/// server's host there is none to hide, and the second replica only makes gradients staler
/// and takes the cores the job shares: on one host async was as fast or faster without it,
/// and 0.6-1 point more accurate (docs/parameter_server.md).
bool overlapOf(const ParameterServerOptions& options, const PsJob& job,
               const ps::ServerGroup& servers) {
  if (options.mode == ps::Mode::Sync) return false;
  if (options.overlap) return *options.overlap;
  return servers.sharedServers() < job.role.servers;
}

/// A worker that starts late (its node slow to start, its data slow to load on a busy
/// machine) may find that the others did every unit and the chief ended the job, its servers
/// gone: it has nothing left to do, which is not a failure.
ParameterServerSummary lateWorker(const PsJob& job) {
  std::fprintf(stderr,
               "worker %d: the job finished before this worker connected; nothing left to do\n",
               job.role.index);
  ParameterServerSummary summary;
  summary.role = ps::Role::Worker;
  summary.index = job.role.index;
  summary.joinedTooLate = true;
  return summary;
}

/// Positions [0, n) of an epoch's sample order.
std::vector<int64_t> epochOrder(int64_t n, const ParameterServerOptions& options, int64_t epoch) {
  if (options.shuffle) return data::epochPermutation(n, options.seed, epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

}  // namespace

ParameterServerSummary runWorker(const PsJob& job, comm::Store& store,
                                 const parallel::ModelFactory& makeModel,
                                 const data::Dataset& train, const ParameterServerOptions& options,
                                 const ParameterServerCallbacks& callbacks,
                                 observe::Logger& logger, RankStatus& status) {
  const int index = job.role.index;
  if (jobFinished(store)) return lateWorker(job);
  std::optional<ps::ServerGroup> connected;
  std::optional<ps::UnitClient> chief;
  try {
    connected.emplace(ps::ClientOptions{ps::ClientRole::Worker, index, options.compression,
                                        job.role.token, job.timeout, options.sharedMemory},
                      job.placement, serverAddresses(store, job));
    chief.emplace(store.getString(ps::chiefAddressKey(), job.timeout), index, job.role.token,
                  job.timeout, options.heartbeat);
  } catch (const Error&) {
    // The chief ended the job while this worker read the addresses or connected.
    if (jobFinished(store)) return lateWorker(job);
    throw;
  }
  const bool hasBuffers = !job.model->namedBuffers().empty();
  // A resumed job's workers start from the buffers of the chief's checkpoint.
  if (hasBuffers && store.check({ps::startBuffersKey()}))
    unpackBuffers(*job.model, store.get(ps::startBuffersKey(), job.timeout),
                  "the chief's checkpoint");
  ps::ServerGroup& servers = *connected;
  ps::UnitClient& units = *chief;
  // Overlapped, a second replica of the model computes while the first one's exchange runs.
  std::vector<std::shared_ptr<nn::Module>> models = {job.model};
  std::vector<parallel::NamedTensors> replicas = {job.parameters};
  const bool overlapped = overlapOf(options, job, servers);
  if (overlapped) {
    models.push_back(makeModel());
    replicas.push_back(models.back()->namedParameters());
    if (hasBuffers) copyBuffers(*job.model, *models.back());
  }
  for (const auto& model : models) model->train(true);
  ps::WorkerExchange exchange(servers, replicas, overlapped ? options.lookahead : 0.0);
  logger.debug("worker exchange", {{"worker", index},
                                    {"overlapped", overlapped},
                                    {"lookahead", overlapped ? options.lookahead : 0.0},
                                    {"servers_in_shared_memory", servers.sharedServers()}});
  const OutputLoss loss = options.loss ? options.loss : [](const Tensor& output, const Tensor& labels) {
    return crossEntropy(output, labels);
  };
  int64_t pushes = 0;
  exchange.pull();
  bool idle = false;
  int64_t orderEpoch = -1;
  std::vector<int64_t> order;
  ps::UnitReport report;
  for (;;) {
    // Waiting for a unit, this worker must not hold back the others' rounds (sync) or
    // count as the slowest (ssp): it leaves until its next push.
    const std::optional<ps::Unit> unit = units.next(report, [&] {
      servers.leave();
      idle = true;
    });
    if (!unit) break;
    if (unit->end > train.size())
      KOLO_THROW(FormatError, "the chief handed worker ", index, " samples [", unit->begin, ", ",
                 unit->end, ") of a training set of ", train.size());
    if (idle) exchange.pull();
    idle = false;
    if (unit->epoch != orderEpoch) {
      orderEpoch = unit->epoch;
      order = epochOrder(train.size(), options, orderEpoch);
    }
    report = ps::UnitReport{unit->id, 0.0, 0};
    for (int64_t at = unit->begin; at < unit->end; at += job.workerBatch) {
      const std::vector<int64_t> indices(order.begin() + at,
                                         order.begin() + std::min(at + job.workerBatch, unit->end));
      const auto stepStart = Clock::now();
      const data::Batch batch = train.gather(indices);
      const auto current = static_cast<size_t>(exchange.current());
      for (auto& [name, p] : replicas[current]) {
        Tensor handle = p;
        handle.zeroGrad();
      }
      Tensor value = loss(models[current]->forward(batch.inputs), batch.labels);
      value.backward();
      // One chain of running statistics per worker: the other replica goes on from these.
      if (hasBuffers && models.size() > 1) copyBuffers(*models[current], *models[1 - current]);
      const double batchLoss = value.item();
      if (!std::isfinite(batchLoss))
        KOLO_THROW(DivergedError, "worker ", index, ": loss ", batchLoss, " in epoch ",
                   unit->epoch + 1, "; try a smaller learning rate");
      if (callbacks.beforePush)
        callbacks.beforePush(
            {.worker = index,
             .push = pushes,
             .seconds = std::chrono::duration<double>(Clock::now() - stepStart).count()});
      ++pushes;
      exchange.pushAndSwap();
      report.lossSum += batchLoss;
      ++report.batches;
      const double seconds = std::chrono::duration<double>(Clock::now() - stepStart).count();
      status.setEpoch(unit->epoch + 1);
      status.update("training", pushes, batchLoss, seconds,
                    static_cast<double>(indices.size()) / std::max(seconds, 1e-9));
    }
    // A unit reported done has every push answered and this worker's buffers published: the
    // chief evaluates, checkpoints and ends the job on that.
    exchange.settle();
    if (hasBuffers) publishBuffers(store, index, *models[static_cast<size_t>(exchange.current())]);
  }
  // The chief stops the servers once every worker has been told the job is over, so they
  // may already be gone: leaving is a courtesy.
  try {
    servers.leave();
  } catch (const Error&) {
  }
  ParameterServerSummary summary;
  summary.role = ps::Role::Worker;
  summary.index = index;
  summary.steps = pushes;
  return summary;
}

}  // namespace kolo::train::detail
