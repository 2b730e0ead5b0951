// `kolo train`'s configuration (the flags as a struct, train_flags.cc), recipe defaults, and
// the runners that map it onto the library: runTraining onto the train engines and
// train::fit (train_run.cc), the parameter-server and federated runs onto their drivers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/data.h"
#include "kolo/nn/layers.h"
#include "kolo/nn/models.h"
#include "kolo/observe.h"
#include "kolo/optim.h"
#include "kolo/parallel/balancer.h"
#include "kolo/parallel/federated.h"
#include "kolo/parallel/strategy.h"
#include "kolo/train/elastic.h"
#include "kolo/train/engine.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"
#include "kolo/train/parameter_server.h"
#include "kolo/training_data.h"

// CLI11 is heavy to parse: only the command files that build options include it.
namespace CLI {
class App;
}  // namespace CLI

namespace kolo::nn {
class Module;
}

namespace kolo::cli {

/// Everything `kolo train` can be told: one member per flag (train_flags.cc declares each
/// with its help). Unset optionals take the recipe's defaults (see resolveRecipe).
struct TrainConfig {
  /// The flags given on the command line, whatever their values (checkFlagScopes).
  std::set<std::string> givenFlags;
  std::string model = "mlp";
  std::optional<int64_t> epochs;
  int64_t steps = 0;
  int64_t batch = 128;  // the global batch (parameter servers: each worker's)
  int accumulate = 1;   // micro-batches per optimizer step (train::FitOptions::accumulate)
  std::optional<std::string> optimizer;
  std::optional<double> lr, momentum, beta1, weightDecay;
  bool nesterov = false;
  std::string schedule = "auto";
  std::optional<int64_t> warmupSteps;
  double clipNorm = 0.0;
  uint64_t seed = 0;
  bool shuffle = true;
  bool dropLast = true;
  /// --data, --test-data and the data files' flags (train_data.cc; the seed is --seed's); the
  /// lm reads data.path and data.testPath as texts or token files.
  data::TrainingDataSpec data;
  std::string tokenType;  // "" : --data is a text, read as bytes
  int64_t vocab = 0;      // a token file's vocabulary (0: its largest token + 1)
  /// Set once the data is read: the built-in models' sizes, and the training split's
  /// standardisation statistics (data::Standardizer::toString, "" for none), or an image
  /// folder's per-channel normalisation ("mean=M0,M1,...;std=S0,S1,...", "" for none).
  nn::ModelData modelData;
  std::string standardizer, channelNormalization;
  std::string initPath, savePath, metricsPath, timelineDir;
  int threads = 1;
  std::string precision = "f32";

  // Data parallel (parallel::strategyOptionsFromNames) and fsdp.
  std::string strategy = "one-device";
  int replicas = 2;
  std::string reduction = "ring";
  std::string algorithm = "auto";
  double bucketMb = 25.0, firstBucketMb = 1.0;
  std::string overlap = "auto", shardOptimizer = "auto", prefetch = "auto";
  std::string shard = "full";
  int shardGroup = 0;
  bool hsdp = false;
  int64_t unitParams = 0;
  bool shardReplicas = false;  // --strategy fsdp with --mesh dp=D,tp=T: fsdp over the replicas
  std::string compress = "none";
  bool balance = false;
  int64_t balanceEvery = 10;
  bool syncBatchNorm = false;  // --sync-bn

  // Parameter servers (under kolo run --ps P --workers W): the --ps-* flags and --staleness, whose defaults
  // train_ps.cc completes (the look-ahead of async's and ssp's Adam).
  train::ParameterServerOptions ps;

  // --strategy federated: the library's options, and what the command derives them from.
  parallel::fed::FederatedOptions federated;
  int64_t rounds = 50;
  double clientFraction = 0.1;  // clientsPerRound without --clients-per-round
  std::string partition = "iid";

  // The lm and model parallelism (docs/model_parallel.md).
  int64_t layers = 4, dModel = 128, heads = 4, seqLen = 64;
  std::string arch = "gpt";
  int64_t kvHeads = 0;  // llama: 0 = as many as heads
  std::string pipelineSchedule = "1f1b";
  int stages = 1, tp = 1;
  bool sequenceParallel = false;
  std::string mesh;
  int microBatches = 1;
  std::string splitAt;  // "" = by measured cost
  bool recompute = false;
  int64_t sampleBytes = 240;
  std::string memoryLimit;

  // Checkpoints.
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int keepCheckpoints = 3;
  std::string resumeDir;

  // Metrics and checks.
  int64_t timingSkip = 20;
  bool detectAnomaly = false;
  int64_t checkSync = 0;
  int64_t metricsEvery = 50;
  std::string statusFile;
  int progress = -1;  // -1: a bar on a terminal, plain lines otherwise; 0: plain lines; 1: a bar
  bool quiet = false;

  /// Faults for tests and benchmarks (kolo/train/faults.h); ranks are launch ranks.
  train::FaultPlan faults;
};

/// The configuration after defaults: the optimizer and the learning-rate schedule, by name
/// (optim::makeOptimizer, optim::makeSchedule), and the epochs.
struct Recipe {
  optim::OptimizerSpec optimizer;
  optim::ScheduleSpec schedule;
  int64_t epochs = 0;
};

/// Fills the defaults. With neither --optimizer nor --lr, the default recipe: 10 epochs,
/// linear warm-up for half an epoch then cosine to zero, Nesterov SGD with momentum 0.9 and
/// lr 0.1 (mlp) / 0.05 (cnn). With --optimizer sgd: lr 0.05 (mlp) / 0.02 (cnn), momentum
/// 0.9; adam/adamw: lr 1e-3. Schedule "auto" is warm-up + cosine when --lr was not given
/// and constant when it was. Throws InvalidArgument for a flag the optimizer does not take.
Recipe resolveRecipe(const TrainConfig& config, int64_t stepsPerEpoch);

/// The seeded built-in model of --model with --init's weights (a missing file or weights
/// that do not fit are a FileError, exit code 3). For lm, `begin` and `end` (< 0: the last)
/// keep only its layers [begin, end), placeholders standing for the others, so that a
/// pipeline stage never holds the whole model; --init fills what it holds.
std::shared_ptr<nn::Sequential> buildModel(const TrainConfig& config, int begin = 0, int end = -1);

/// The datasets of --data and its flags, through data::openTrainingData (train_data.cc). Sets
/// config.modelData (the samples' shape and the classes), config.standardizer and
/// config.channelNormalization. Throws what openTrainingData throws and InvalidArgument for
/// flags that do not fit the data.
data::TrainingData loadDatasets(TrainConfig& config, observe::Logger& logger);

/// What fixes the weights' shapes and the data order (model, batch, seed), stored in every
/// checkpoint; a resume with other values is refused. The strategy and the rank count may
/// change on resume: the loader position counts global batches.
std::map<std::string, std::string> runIdentity(const TrainConfig& config);

/// The flags that train::FitOptions and train::ParameterServerOptions read alike: length,
/// batch, data order, metrics, progress, checkpoints and resume, the run's identity, `logger`
/// and the describe fields of the recipe.
template <class RunOptions>
void setRunOptions(const TrainConfig& config, const Recipe& recipe, observe::Logger& logger, RunOptions& options) {
  // --epochs given: the run ends at the first of --epochs and --steps; --steps alone sets it.
  options.epochs = config.epochs ? *config.epochs : (config.steps > 0 ? 0 : recipe.epochs);
  options.steps = config.steps;
  options.batch = config.batch;
  options.shuffle = config.shuffle;
  options.seed = config.seed;
  options.metricsPath = config.metricsPath;
  options.progress = config.progress;
  options.quiet = config.quiet;
  options.checkpointDir = config.checkpointDir;
  options.checkpointEvery = config.checkpointEvery;
  options.keepCheckpoints = config.keepCheckpoints;
  options.resumeDir = config.resumeDir;
  options.statusFile = config.statusFile;
  options.identity = runIdentity(config);
  options.logger = &logger;
  options.describe = {{"model", config.model}, {"optimizer", recipe.optimizer.name}, {"lr", recipe.optimizer.lr}};
}

/// --save (nothing without it): `model`'s weights as safetensors, with the model's name and
/// the `steps` done; logged.
void saveWeights(const TrainConfig& config, nn::Module& model, int64_t steps, observe::Logger& logger);

/// What the data-parallel engines of every job, elastic ones too, read from the flags: the
/// strategy, the reducer's buckets, recomputation and --balance. `comm`: the job's
/// communicator (multi-worker-mirrored and fsdp), else null.
train::DataParallelOptions engineOptions(const TrainConfig& config, std::shared_ptr<comm::Communicator> comm);

/// `kolo train` with every strategy but parameter servers and federated (train_run.cc): the
/// flags mapped onto a train::DataParallelEngine (one-device, mirrored, central-storage,
/// multi-worker-mirrored, fsdp), a train::ModelParallelEngine (pipeline, tensor, --mesh, the
/// lm on one device) or under kolo run --elastic a train::ElasticEngine, over the seeded
/// built-in model (and --init weights), and onto train::fit. Rank 0 writes --save and prints
/// the summary: the per-rank figures of model-parallel and lm runs, the lm's held-out loss
/// (also in the metrics' final line) and a sample of generated text. Returns the exit status
/// (0 for an elastic joiner the job finished without); throws kolo::Error subclasses with
/// clear messages (missing dataset, bad flags, wrong-shape init file, a global batch the
/// replicas cannot share, sizes the job cannot hold).
int runTraining(const TrainConfig& config, observe::Logger& logger);

/// `--strategy parameter-server`: runs this process's role (server, worker or chief, from
/// KOLO_ROLE) of a job started by kolo run --ps P --workers W. The chief writes --metrics and
/// --save and prints the summary line; returns the exit status.
int runParameterServerRole(const TrainConfig& config, observe::Logger& logger);

/// `--strategy federated` (train_federated.cc): this process's part of the job, through
/// train::trainFederated: without `kolo run` (or with -n 1), the server and one client host as
/// threads over an in-memory store; under `kolo run -n N`, rank 0 is the server and ranks
/// 1..N-1 host the clients, over the job's TCP store. The server writes --metrics (one line
/// per round), --save, and the summary line; returns the exit status.
int runFederated(const TrainConfig& config, observe::Logger& logger);

/// `--workers N` (train_workers.cc): runs this command on N local ranks (its own arguments
/// but --workers, with `--strategy multi-worker-mirrored` when none was named) as kolo run -n N
/// starts them, and returns the job's exit status. Throws InvalidArgument for another strategy
/// than multi-worker-mirrored or fsdp, or inside an already launched job.
int runWorkers(int workers);

}  // namespace kolo::cli
