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

/// A worker's loop: units from the chief, a push per batch, until the job is over.
ParameterServerSummary runWorker(const PsJob& job, comm::Store& store,
                                 const parallel::ModelFactory& makeModel,
                                 const data::Dataset& train, const ParameterServerOptions& options,
                                 const ParameterServerCallbacks& callbacks, observe::Logger& logger);

/// The chief's loop: resume, hand out units, evaluate, record and checkpoint after each
/// epoch, stop the servers at the end.
ParameterServerSummary runChief(const PsJob& job, comm::Store& store,
                                std::shared_ptr<const data::Dataset> validation,
                                const ParameterServerOptions& options,
                                const ParameterServerCallbacks& callbacks, observe::Logger& logger);

}  // namespace kolo::train::detail
