// The parameter-server engine of the train layer: what a user's own program calls to train its
// own model with parameter servers, in a job started by `kolo run --ps P --workers W`. Every
// process of the job calls trainParameterServer() with the same arguments; the library reads
// the process's role from the environment (parallel::ps::roleFromEnvironment) and runs it:
// a server holds its slices of the parameters and their optimizer state and applies the
// updates; a worker asks the chief for units of data, pushes a gradient per batch and takes
// the values it gets back; the chief hands out the data, evaluates after each epoch, writes
// fit's metrics schema, progress line and checkpoints (train::save over the servers' state),
// and stops the servers at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/data.h"
#include "kolo/observe.h"
#include "kolo/parallel/parameter_server.h"
#include "kolo/parallel/strategy.h"
#include "kolo/train/evaluate.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"
#include "kolo/train/state.h"

namespace kolo::train {

/// How a parameter-server job trains: the options every trainer reads (RunOptions), in
/// fit's words, and the servers' own. What a step is: one update of the servers'
/// parameters, one optimizer step of `batch` samples, the global batch. In sync a step is one
/// round: the mean of one batch of batch/W samples from each of the W workers (so `batch`
/// must split evenly over them), one device's global batch. In async and ssp it is one
/// worker's push of `batch` samples. An epoch has floor(training samples / batch) steps under
/// every mode, as under fit. Steps, the schedule and checkpoints count these.
struct ParameterServerOptions : RunOptions {
  /// This process's role and the job's shape, store and token; unset: from the environment
  /// (parallel::ps::roleFromEnvironment, what `kolo run --ps P --workers W` sets). Set it to
  /// start the roles some other way (threads of one process share a store this way).
  std::optional<parallel::ps::RoleInfo> role{};
  /// How the servers turn pushes into updates, and SSP's bound on a worker's lead.
  parallel::ps::Mode mode = parallel::ps::Mode::Sync;
  int staleness = 2;
  /// Parameters of more than this many bytes are split over the servers; smaller ones go
  /// whole to the server holding the fewest bytes (parallel::ps::placeParameters).
  int64_t shardBytes = 1 << 20;
  /// A worker's batches per unit of data the chief hands it at a time (faster workers take
  /// more). In sync the workers take them W alike at a time, the epoch's last W shorter when
  /// its steps are not a multiple of this, so that each round has a push from every worker
  /// and the run takes exactly its planned steps (unless a worker is lost).
  int64_t unitBatches = 8;
  /// Values on the workers' wire: f32, bf16 or fp16 (the servers keep f32).
  parallel::ps::Compression compression = parallel::ps::Compression::None;
  /// Exchange values through shared memory with servers on the worker's host (false: TCP).
  bool sharedMemory = true;
  /// A worker that sends no heartbeat for this long is lost, its unit handed to the others
  /// (0: only a closed connection tells).
  std::chrono::milliseconds heartbeat{std::chrono::seconds(10)};
  /// Async and ssp: divide a gradient `tau` updates stale by tau (staleness-aware SGD). Unset:
  /// on in async and ssp; sync ignores it.
  std::optional<bool> stalenessLr{};
  /// A worker computes its next step while its exchange runs (async and ssp only; true in
  /// sync is InvalidArgument). Unset: on where some server is reached over TCP.
  std::optional<bool> overlap{};
  /// Overlapped workers compute on the newest values plus `lookahead` times their last change
  /// (parallel::ps::WorkerExchange); 0: off. Workers that do not overlap ignore it; with
  /// `overlap` false or in sync it is InvalidArgument.
  double lookahead = 0.0;
  /// Deadline of every wait on a peer (connecting, a reply, a sync round, a unit).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// A worker's loss of a batch; default cross-entropy of the model's output.
  OutputLoss loss{};
  // Checkpoints (RunOptions::checkpointDir): train::save of the servers' state
  // (ParameterServerState), taken between epochs with the servers quiet: at the end of each
  // epoch in which a multiple of `checkpointEvery` steps was reached, and at the end. They
  // are recorded at the next epoch's start, as fit's at an epoch's end. Resume
  // (RunOptions::resumeDir) takes any strategy's checkpoint of the same model at an epoch's
  // end.
};

/// What a worker is about to push (ParameterServerCallbacks::beforePush).
struct WorkerPush {
  int worker = 0;         // the worker's index (0..W-1)
  int64_t push = 0;       // this worker's pushes before this one
  double seconds = 0.0;   // its batch's gather, forward and backward
};

/// Hooks into the roles' loops.
struct ParameterServerCallbacks {
  /// On a worker, before each push (once the gradient is computed): a benchmark slows a
  /// worker here, a test kills or stops one at a chosen push.
  std::function<void(const WorkerPush&)> beforePush{};
  /// On the chief, after each epoch's evaluation and checkpoint, before its metrics line.
  std::function<void(const EpochEnd&)> onEpochEnd{};
};

/// The callbacks carrying out `plan` on this process, launch rank `rank` of the job (-1:
/// none), before each push (counted from 0): the worker whose index is plan.slow.rank takes
/// plan.slow.factor times its batch's compute, sleeping the difference; plan's kill and failure
/// meant for `rank` strike at that push (FaultPlan::strike). `kolo train`'s --debug-slow-worker,
/// --debug-kill-rank and --fail-at-step; a program of one's own tests its recovery the same way.
ParameterServerCallbacks injectWorkerFaults(const FaultPlan& plan, int rank);

/// What a role returns when the job is over: fit's figures (FitSummary) on the chief, with
/// the model holding the servers' final weights, and the roles' own.
struct ParameterServerSummary : FitSummary {
  parallel::ps::Role role = parallel::ps::Role::Worker;
  int index = 0;  // among the processes of its role
  // FitSummary::steps: steps (server updates) done, resumed ones included (the chief's and
  // servers' figure; a worker's is its own pushes). The other figures are the chief's: the
  // rates are of all workers together (the steady one without this run's first epoch).
  /// The chief's: the servers' largest staleness, the workers still in the job at the end,
  /// the units each worker did.
  int64_t stalenessMax = 0;
  int workersAlive = 0;
  std::vector<int64_t> unitsDone{};
  /// A worker that started after the job ended had nothing to do.
  bool joinedTooLate = false;
};

/// The training data of a parameter-server job, loaded only where needed: workers read
/// samples, while the servers and the chief need only the training set's size.
struct ParameterServerData {
  /// The training set (called once, on workers; and on the other roles too when `trainSize`
  /// is not given).
  std::function<std::shared_ptr<const data::Dataset>()> train{};
  /// The training set's size (< 0: train()->size()).
  int64_t trainSize = -1;
  /// The validation set the chief evaluates on after each epoch (called once, on the chief;
  /// empty: none).
  std::function<std::shared_ptr<const data::Dataset>()> validation{};
};

/// Runs this process's role of the parameter-server job described by options.role or the
/// environment (parallel::ps::roleFromEnvironment: `kolo run --ps P --workers W`, or
/// mpirun/srun with KOLO_PS_SERVERS, where server 0 hosts the job's store). `model` is called by every
/// process (twice on an overlapped worker) and must build the same weights each time
/// (seeded); on the chief the model it built holds the trained weights when this returns
/// (ParameterServerSummary::model); `optimizer` builds a server's optimizer over its slices of the parameters.
/// Blocking until the chief ends the job; collective over the job's processes, which all
/// pass the same options. Throws InvalidArgument for bad options (naming the option),
/// FileError/Mismatch from resuming, DivergedError when a worker's loss is not finite,
/// PeerError/Timeout naming a server or the chief that vanished (a lost worker is not an
/// error: its units go to the others).
ParameterServerSummary trainParameterServer(parallel::ModelFactory model,
                                            parallel::OptimizerFactory optimizer,
                                            const ParameterServerData& data,
                                            const ParameterServerOptions& options,
                                            const ParameterServerCallbacks& callbacks = {});

/// The same over datasets every role has loaded (`validation` may be null).
ParameterServerSummary trainParameterServer(parallel::ModelFactory model,
                                            parallel::OptimizerFactory optimizer,
                                            std::shared_ptr<const data::Dataset> train,
                                            std::shared_ptr<const data::Dataset> validation,
                                            const ParameterServerOptions& options,
                                            const ParameterServerCallbacks& callbacks = {});

/// The servers' state as the chief sees it, for train::save and train::load: the weights
/// whole (assembled from the servers' slices), the optimizer state whole per parameter and
/// the servers' version (metadata "ps_version"), so that a parameter-server checkpoint is
/// the same kind of directory as every other strategy's (any strategy, and any number of
/// servers, may load it). The servers write and read their parts through files in
/// `staging` (a directory the chief and every server can reach), deleted afterwards.
class ParameterServerState : public Stateful {
 public:
  /// `servers`: the chief's connections to every server; `parameters`: a model's parameters
  /// in placement order (their shapes are the whole tensors'; stateDict() pulls the values
  /// into them); `buffers`: the model's buffers (a batch norm's running statistics, which the
  /// workers keep and the chief averages), saved with the weights as they are and loaded
  /// into these tensors.
  ParameterServerState(std::shared_ptr<parallel::ps::ServerGroup> servers,
                       parallel::NamedTensors parameters, std::string staging,
                       parallel::NamedTensors buffers = {});
  /// Every server's values, optimizer state and version, merged. The servers must be quiet.
  /// Blocking. Throws Mismatch when the servers' optimizers disagree in kind or step count.
  StateDict stateDict() override;
  /// Splits `state` over the servers by the placement and makes every server take its part.
  /// The servers must be quiet. Blocking. Throws Mismatch naming a tensor the state lacks or
  /// whose size differs, or an optimizer kind other than the servers'.
  void loadStateDict(const StateDict& state) override;
  /// The servers' version after the last stateDict() or loadStateDict().
  int64_t version() const { return version_; }

 private:
  std::shared_ptr<parallel::ps::ServerGroup> servers_;
  parallel::NamedTensors parameters_;
  std::string staging_;
  parallel::NamedTensors buffers_;
  int64_t version_ = 0;
};

}  // namespace kolo::train
