// `kolo train`'s configuration (the CLI flags as a struct), recipe defaults, and the runners
// that map it onto the library: runDataParallel onto train::DataParallelEngine and
// train::fit (train_data_parallel.cc), runModelParallel onto train::ModelParallelEngine and
// train::fit (train_pipeline.cc); the other families' runners still hold their loops.
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
#include "kolo/observe.h"
#include "kolo/optim.h"
#include "kolo/parallel/balancer.h"
#include "kolo/parallel/strategy.h"
#include "kolo/train/engine.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"

// CLI11 is heavy to parse: only the command files that build options include it.
namespace CLI {
class App;
}  // namespace CLI

namespace kolo::nn {
class Module;
}

namespace kolo::cli {

/// Everything `kolo train` can be told. Unset optionals take the recipe's defaults
/// (see resolveRecipe).
struct TrainConfig {
  /// The options given on the command line ("--overlap", ...), whatever their values: what a
  /// strategy that does not read them refuses (checkFlagScopes, train_flags.h).
  std::set<std::string> givenFlags;
  std::string model = "mlp";             // mlp | cnn | lm
  std::optional<int64_t> epochs;         // default: the recipe's
  int64_t steps = 0;                     // total optimizer steps; 0 = all epochs
  int64_t batch = 128;                   // the global batch (over every replica of the job)
  std::optional<std::string> optimizer;  // sgd | adam | adamw
  std::optional<double> lr;
  std::optional<double> momentum;  // sgd only
  std::optional<double> beta1;     // adam and adamw only
  std::optional<double> weightDecay;
  bool nesterov = false;
  std::string schedule = "auto";       // auto | constant | cosine | warmup-cosine | step
  std::optional<int64_t> warmupSteps;  // default: half an epoch (warmup-cosine)
  double clipNorm = 0.0;               // 0: no clipping (one-device and fsdp)
  uint64_t seed = 0;
  bool shuffle = true;
  /// A last global batch shorter than --batch is dropped (true) or padded (false).
  bool dropLast = true;
  /// Train on the first `trainLimit` samples of the training split only (0: all).
  int64_t trainLimit = 0;
  std::string dataDir = data::kFashionMnistDir;
  std::string initPath;
  std::string savePath;
  std::string metricsPath;
  std::string timelineDir;  // --timeline: Chrome trace of every rank (kolo/trace.h)
  int threads = 1;
  std::string precision = "f32";  // --precision: f32 | bf16 matrix products (kolo/precision.h)

  // Distribution (see parallel::strategyOptionsFromNames).
  std::string strategy = "one-device";
  int replicas = 2;                // mirrored, central-storage
  std::string reduction = "ring";  // mirrored: reduce-to-one | hierarchical-copy | ring
  std::string algorithm = "auto";  // multi-worker-mirrored all-reduce algorithm
  double bucketMb = 25.0;          // gradient bucket capacity (MiB)
  double firstBucketMb = 1.0;      // first bucket's capacity (MiB)
  std::string overlap = "auto";    // auto | on | off: bucket all-reduces during backward
  std::string shardOptimizer = "auto";  // auto | on | off: sharded update on one host
  std::string prefetch = "auto";   // auto | on | off: a loader thread gathers the next batches
  std::string shard = "full";      // fsdp: grad (ZeRO-2) | full (ZeRO-3)
  int shardGroup = 0;              // fsdp: ranks per shard group (HSDP); 0: every rank
  bool hsdp = false;               // fsdp: shard groups of the ranks of one host
  int64_t unitParams = 0;          // fsdp: the fewest parameters of a unit; 0: one per child
  std::string compress = "none";   // none | fp16 | bf16 | powersgd:RANK | topk:FRACTION

  // Parameter servers (--strategy parameter-server, under kolo run --ps P --workers W);
  // `batch` is then each worker's batch (one push).
  std::string psMode = "sync";      // sync | async | ssp
  int staleness = 2;                // ssp: the most pushes a worker may be ahead of the slowest
  int64_t psShardBytes = 1 << 20;   // parameters above this are split over the servers
  int64_t psUnitBatches = 8;        // batches per unit of data the chief hands out
  std::string psCompress = "none";  // none | bf16: values on the workers' wire
  std::string psTransport = "auto";  // auto (shared memory on one host, else TCP) | tcp
  double psHeartbeatSeconds = 10.0;  // a worker silent this long is lost (0: no heartbeats)
  std::string psStalenessLr = "auto";  // auto (on in async/ssp) | on | off: gradient / staleness
  std::string psOverlap = "auto";  // auto (async/ssp over TCP) | on | off: exchange during compute
  /// Overlapped: compute at reply + a (reply - previous reply); default 1.5 with the Adam
  /// defaults of async and ssp, 0 (off) otherwise.
  std::optional<double> psLookahead;
  /// --balance (multi-worker-mirrored, elastic jobs too): each global batch is split over the
  /// ranks in proportion to their measured speed, re-planned every `balanceEvery` steps
  /// (parallel::Balancer, train_balance.h).
  bool balance = false;
  int64_t balanceEvery = 10;

  // The `lm` model and pipeline parallelism (train_pipeline.cc, docs/model_parallel.md).
  bool batchGiven = false;  // --batch was given (lm's default batch is smaller)
  int64_t layers = 4, dModel = 128, heads = 4, seqLen = 64;
  std::string pipelineSchedule = "1f1b";  // gpipe | 1f1b
  int stages = 1;                         // --stages: one rank per stage
  int tp = 1;                             // --tp: ranks of --strategy tensor
  bool sequenceParallel = false;          // --sequence-parallel: norms on seq/tp tokens
  std::string mesh;                       // --mesh dp=D,pp=P | dp=D,tp=T (hybrids)
  int microBatches = 1;
  std::string splitAt;  // "i,j,...": first layer of stages 1..P-1 ("" = by measured cost)
  bool recompute = false;
  int64_t sampleBytes = 240;  // lm: bytes generated at the end
  std::string memoryLimit;    // --memory-limit: tensor memory budget of each rank ("" = none)

  // Checkpoints.
  std::string checkpointDir;    // "" = none
  int64_t checkpointEvery = 0;  // steps between checkpoints (0: only at the end)
  int keepCheckpoints = 3;
  std::string resumeDir;  // "" = start fresh

  /// Steps at the start of the run left out of the steady-state throughput.
  int64_t timingSkip = 20;
  /// Faults injected for tests and benchmarks (--fail-at-step, --debug-kill-rank,
  /// --debug-slow-rank, --debug-nan-at, --debug-perturb; kolo/train/faults.h). Ranks are
  /// launch ranks; parameter-server workers strike before their push STEP, federated client
  /// hosts before round STEP.
  train::FaultPlan faults;
  // Tests of elastic jobs (kolo run --elastic, train_elastic.cc): launch rank
  // `debugKillInRegroup` SIGKILLs itself in the first membership change, once the members are
  // agreed and before their communicator is built; each rank appends "GENERATION STEP ID..."
  // for every step it completes to debugSampleLog.rank-N; at step debugAwaitJoin the members
  // wait for joiners to register (up to --max-ranks), so that they are admitted there.
  int debugKillInRegroup = -1;
  int64_t debugAwaitJoin = -1;
  std::string debugSampleLog;

  // Numeric checks and monitoring (train_checks.h, train_monitor.h).
  bool detectAnomaly = false;   // name the first module/rank/step with a NaN or infinity
  int64_t checkSync = 0;        // compare the ranks' weight hashes every N steps (0: off)
  int64_t metricsEvery = 50;    // steps between the ranks' timing exchange (metrics, progress)
  std::string statusFile;       // each rank writes FILE.rank-N (KOLO_STATUS_FILE)

  /// -1: a bar if stderr is a terminal, plain lines otherwise; 0: plain lines; 1: bar.
  int progress = -1;
  bool quiet = false;
};

/// The configuration after defaults: every optional filled in.
struct Recipe {
  std::string optimizer;
  double lr = 0.0;
  double momentum = 0.0;
  double beta1 = 0.9;  // adam, adamw
  bool nesterov = false;
  double weightDecay = 0.0;
  int64_t epochs = 0;
  std::string schedule;
  int64_t warmupSteps = 0;
};

/// Fills the defaults. With neither --optimizer nor --lr, the default recipe: 10 epochs,
/// linear warm-up for half an epoch then cosine to zero, Nesterov SGD with momentum 0.9 and
/// lr 0.1 (mlp) / 0.05 (cnn). With --optimizer sgd: lr 0.05 (mlp) / 0.02 (cnn), momentum
/// 0.9; adam/adamw: lr 1e-3. Schedule "auto" is warm-up + cosine when --lr was not given
/// and constant when it was. Throws InvalidArgument for unknown names or bad values.
Recipe resolveRecipe(const TrainConfig& config, int64_t stepsPerEpoch);

/// Loads the --init file `path` into `model`; a missing file or weights that do not fit are
/// a FileError (exit code 3), like a malformed file.
void loadInitialWeights(const std::string& path, nn::Module& model);

/// The Fashion-MNIST training set of --data, cut to its first --train-limit samples when
/// that is set. Throws FileError naming the directory when the files are missing.
std::shared_ptr<data::TensorDataset> loadTrainingSet(const TrainConfig& config);

/// Builds the optimizer of a recipe over `parameters`.
std::unique_ptr<optim::Optimizer> makeOptimizer(const Recipe& recipe,
                                                const optim::NamedParameters& parameters);
/// Builds the learning-rate schedule of a recipe for `totalSteps` optimizer steps.
std::unique_ptr<optim::LrSchedule> makeSchedule(const Recipe& recipe, int64_t totalSteps);

/// What fixes the weights' shapes and the data order (model, batch, seed), stored in every
/// checkpoint; a resume with other values is refused. The strategy and the rank count may
/// change on resume: the loader position counts global batches.
std::map<std::string, std::string> runIdentity(const TrainConfig& config);

/// train::fit's options from the flags every data-parallel runner shares: length, batch,
/// data order, schedule (over `recipe`, which must outlive the options), metrics, progress,
/// status file, checkpoints and resume, the run's identity, `logger` and the describe
/// fields. The runner sets the rest (prefetch, checks).
train::FitOptions fitOptions(const TrainConfig& config, const Recipe& recipe, observe::Logger& logger);

/// fsdp's ranks per shard group: --shard-group, or with --hsdp the ranks of one host (from
/// the launch); 0 for one group of all `worldSize` ranks. Throws InvalidArgument for both
/// flags, or a group that does not divide `worldSize`.
int shardGroupSize(const TrainConfig& config, int worldSize);

/// The values of the data-parallel flags (which strategies take which flags: train_flags.h).
/// Throws InvalidArgument naming the flag.
void checkDataParallelFlags(const TrainConfig& config);

/// A train::DataParallelEngine's options from the flags: the strategy, the reducer's buckets,
/// overlap and sharded update, fsdp's shard level, group and units, clipping, recomputation,
/// --compress's hook and --balance. `comm`: the job's communicator (multi-worker-mirrored and
/// fsdp), else null.
train::DataParallelOptions engineOptions(const TrainConfig& config, std::shared_ptr<comm::Communicator> comm);

/// `kolo train` with a data-parallel strategy (one-device, mirrored, central-storage,
/// multi-worker-mirrored, fsdp): loads Fashion-MNIST, joins the job (multi-worker-mirrored
/// and fsdp: parallel::init()), maps the flags onto a train::DataParallelEngine over the
/// seeded built-in model (and --init weights) and train::fit options, trains, writes --save
/// and prints the summary lines on rank 0. Returns the exit status; throws kolo::Error
/// subclasses with clear messages (missing dataset, bad flags, wrong-shape init file, a
/// global batch the replicas cannot share).
int runDataParallel(const TrainConfig& config, observe::Logger& logger);

/// `--strategy parameter-server`: runs this process's role (server, worker or chief, from
/// KOLO_ROLE) of a job started by kolo run --ps P --workers W. The chief writes --metrics and
/// --save and prints the summary line; returns the exit status.
int runParameterServerRole(const TrainConfig& config, observe::Logger& logger);

/// `kolo train --strategy multi-worker-mirrored` under `kolo run --elastic`: the flags mapped
/// onto a train::ElasticEngine (survivors carry on when ranks die, joiners are admitted;
/// docs/elastic.md) and train::fit; rank 0 writes --save and prints the summary line.
/// Returns the exit status (0 for a joiner the job finished without).
int runElasticTraining(const TrainConfig& config, observe::Logger& logger);

/// Registers --layers, --d-model, --heads, --seq-len, --stages, --micro-batches, --split-at,
/// --recompute, --sample-bytes and --memory-limit on `kolo train` (train_pipeline_options.cc).
void addModelParallelOptions(CLI::App* app, TrainConfig& config);

/// `--model lm`, `--strategy pipeline`, `--strategy tensor` or `--mesh`: maps the flags onto a
/// train::ModelParallelEngine (--stages stages, one rank each under kolo run -n P, one stage
/// without it; --tp tensor ranks; --mesh replicas of either) and train::fit (`--model lm
/// --strategy fsdp` onto a train::DataParallelEngine); rank 0 prints the per-stage timings
/// and the summary, writes --save, and for lm the held-out loss (also in the metrics' final
/// line) and a sample of generated text. Returns the exit status; throws InvalidArgument
/// naming the flag for flags these runs do not take or sizes the job cannot hold.
int runModelParallel(const TrainConfig& config, observe::Logger& logger);

/// `--workers N`: the command line that runs this `kolo train` under `kolo run -n N`:
/// [self, "run", "-n", N, "--", self, "train", args without --workers...], adding
/// `--strategy multi-worker-mirrored` when no strategy was named. `trainArgs` are the words
/// after "train". Throws InvalidArgument for another strategy than multi-worker-mirrored.
std::vector<std::string> workersCommandLine(const std::string& self, int workers,
                                            const std::vector<std::string>& trainArgs);

/// Replaces this process with workersCommandLine() of its own `kolo train` arguments
/// (read from /proc/self/cmdline). Throws InvalidArgument inside an already launched job,
/// IoError when the exec fails; never returns.
[[noreturn]] void execWorkers(int workers);

}  // namespace kolo::cli
