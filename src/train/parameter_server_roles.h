// The roles of a parameter-server job (train/parameter_server.h), one file each: what every
// role derives the same way from the options (PsJob), and the worker's and the chief's loops.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/store.h"
#include "kolo/optim.h"
#include "kolo/train/parameter_server.h"
#include "train/monitor.h"

namespace kolo::train::detail {

/// What every process of the job computes alike from the options and the training set's
/// size.
struct PsJob {
  parallel::ps::RoleInfo role;
  std::shared_ptr<nn::Module> model;
  parallel::NamedTensors parameters;
  parallel::ps::Placement placement;
  int64_t trainSize = 0;
  int64_t workerBatch = 0;      // samples of one push (sync: batch / W, else batch)
  int64_t batchesPerEpoch = 0;  // pushes of one epoch (sync: W per step)
  int64_t stepsPerEpoch = 0;    // server updates of one epoch (sync: rounds), as fit's
  int64_t totalSteps = 0;       // server updates of the whole run
  int64_t epochs = 0;           // epochs begun (the last may be cut short by `steps`)
  int64_t lastEpochSamples = 0;  // samples of the last epoch when it is cut short, else 0
  std::shared_ptr<optim::LrSchedule> schedule;
  std::chrono::milliseconds timeout{};
};

/// "host:port" of every server, from the store (waiting for each up to the job's timeout).
std::vector<std::string> serverAddresses(comm::Store& store, const PsJob& job);

/// Whether the chief has marked the job over (a store that is gone counts as not).
bool jobFinished(comm::Store& store);

// A model's buffers (a batch norm's running statistics) in a parameter-server job: the
// servers hold and update parameters only. A batch norm in training mode normalises with its
// batch's statistics and never reads its running ones, so each worker keeps its own (as each
// replica of a Keras batch norm keeps its moving statistics, sync-on-read variables with MEAN
// aggregation under tf.distribute) and publishes them to the store after every unit; the
// chief's model takes their mean over the workers that published (floating buffers; each
// worker's estimate is of the same data distribution, as in Keras) and, for counters, the
// start's count plus every worker's batches since (num_batches_tracked counts every batch
// the job's workers normalised, as the servers' updates count every push in async) whenever
// it evaluates, checkpoints or ends. A resumed job's workers start from the checkpoint's.

/// The model's buffers as bytes, in namedBuffers() order (both ends build the same model).
comm::Bytes packBuffers(const nn::Module& model);
/// packBuffers' bytes into the model's buffers; FormatError naming `from` for another size.
void unpackBuffers(nn::Module& model, const comm::Bytes& bytes, const std::string& from);
/// Copies the buffers of `from` into those of `to` (the same model's replicas).
void copyBuffers(const nn::Module& from, nn::Module& to);
/// Worker `worker`'s buffers into the store (replacing what it published before).
void publishBuffers(comm::Store& store, int worker, const nn::Module& model);
/// Sets the model's buffers to the mean of what workers 0..workers-1 published, in worker
/// order, summed in f64 (counters: `start`'s, packBuffers of what every worker started from,
/// plus the sum of what each added since); returns how many had published (0: the buffers
/// stay).
int averageBuffers(comm::Store& store, int workers, std::chrono::milliseconds timeout,
                   const comm::Bytes& start, nn::Module& model);

/// This process's place in the job's launch order, servers first, then the chief, then the
/// workers (kolo run --ps and the roles that mpirun's ranks decide alike): the N of its
/// status file's FILE.rank-N.
int launchRank(const parallel::ps::RoleInfo& role);

/// A worker's loop: units from the chief, a push per batch, until the job is over. Its status
/// line: "training", its pushes as the step, its last batch's loss.
ParameterServerSummary runWorker(const PsJob& job, comm::Store& store,
                                 const parallel::ModelFactory& makeModel,
                                 const data::Dataset& train, const ParameterServerOptions& options,
                                 const ParameterServerCallbacks& callbacks, observe::Logger& logger,
                                 RankStatus& status);

/// The chief's loop: resume, hand out units, evaluate, record and checkpoint after each
/// epoch, stop the servers at the end. Its status line: "dispatching" (the servers' updates
/// and the last epoch's loss at each epoch's end), "checkpoint" and "evaluating".
ParameterServerSummary runChief(const PsJob& job, comm::Store& store,
                                std::shared_ptr<const data::Dataset> validation,
                                const ParameterServerOptions& options,
                                const ParameterServerCallbacks& callbacks, observe::Logger& logger,
                                RankStatus& status);

}  // namespace kolo::train::detail
