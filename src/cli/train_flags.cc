// `kolo train`'s flags, each declared once: name, help, the TrainConfig member it sets, its
// check, and the strategies that accept it (train_flags.h). Grouped as `kolo train --help`
// shows them.
#include "cli/train_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>

#include "cli/options.h"
#include "kolo/comm/init.h"
#include "kolo/error.h"
#include "kolo/parallel/elastic.h"
#include "kolo/parallel/mesh.h"
#include "kolo/parallel/parameter_server.h"

namespace kolo::cli {
namespace {

using Where = std::vector<std::string>;

// The strategies (--strategy values) of the table's rows; "lm" stands for --model lm,
// "elastic" for the ranks of kolo run --elastic.
const Where kReducer = {"mirrored", "multi-worker-mirrored"};
const Where kMultiWorker = {"multi-worker-mirrored"};
// Central storage's model never runs forward: nothing there for the anomaly detector to watch.
const Where kWatched = {"one-device", "mirrored", "multi-worker-mirrored", "fsdp"};
const char* kWatchedHint =
    ": it watches the modules that run forward, and central storage's model never does";
const Where kFsdp = {"fsdp"};
const Where kPs = {"parameter-server"};
const Where kFederated = {"federated"};
const Where kLm = {"lm"};
const Where kElastic = {"elastic"};
const char* kHidden = "";  // test hooks: no help line

// Registers flags on `app` in the help group of the current family, recording the scope of
// those that only some strategies accept.
class Registrar {
 public:
  Registrar(CLI::App* app, FlagScopes& scopes) : app_(app), scopes_(scopes) {}
  void group(std::string name) { group_ = std::move(name); }

  template <class T>
  CLI::Option* option(const std::string& names, T& target, const std::string& help, Where where = {},
                      std::string hint = {}) {
    return scoped(app_->add_option(names, target, help), std::move(where), std::move(hint));
  }
  CLI::Option* flag(const std::string& names, bool& target, const std::string& help,
                    Where where = {}, std::string hint = {}) {
    return scoped(app_->add_flag(names, target, help), std::move(where), std::move(hint));
  }
  /// An option whose text `parse` turns into `target` (a library enum, an on/off switch);
  /// `shown`: the default in the help.
  template <class T, class Parse>
  CLI::Option* parsed(const std::string& names, T& target, Parse parse, const std::string& help, Where where,
                      const std::string& shown) {
    auto set = [&target, parse](const std::string& text) { target = parse(text); };
    return scoped(app_->add_option_function<std::string>(names, set, help)->default_str(shown), std::move(where), {});
  }
  /// An option in seconds (fractions too) into a duration.
  CLI::Option* seconds(const std::string& names, std::chrono::milliseconds& target, const std::string& help,
                       Where where) {
    auto set = [&target](double s) { target = std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
    std::ostringstream shown;
    shown << static_cast<double>(target.count()) / 1000.0;
    return scoped(app_->add_option_function<double>(names, set, help)->default_str(shown.str()), std::move(where), {});
  }
  /// A flag that does `act` when given (a negated or shared setting).
  CLI::Option* flag(const std::string& names, std::function<void()> act, const std::string& help) {
    return scoped(app_->add_flag_callback(names, std::move(act), help), {}, {});
  }

 private:
  CLI::Option* scoped(CLI::Option* option, Where where, std::string hint) {
    option->group(group_);
    if (!where.empty()) scopes_.push_back({"--" + option->get_lnames().front(), std::move(where), std::move(hint)});
    return option;
  }

  CLI::App* app_;
  FlagScopes& scopes_;
  std::string group_ = "Training";
};

// auto: unset (the library decides), else on or off.
std::optional<bool> onOffAuto(const std::string& value) {
  if (value == "auto") return std::nullopt;
  return value == "on";
}

// How a message names strategies: "--strategy a, b or c", "--model lm", "kolo run --elastic".
std::string described(const Where& where) {
  std::vector<std::string> strategies, others;
  for (const std::string& w : where) {
    if (w == "lm")
      others.push_back("--model lm");
    else if (w == "elastic")
      others.push_back("kolo run --elastic");
    else
      strategies.push_back(w);
  }
  if (!strategies.empty()) others.insert(others.begin(), "--strategy " + listWords(strategies));
  return listWords(others);
}

}  // namespace

FlagScopes addTrainFlags(CLI::App* app, TrainFlags& flags) {
  TrainConfig& c = flags.config;
  FlagScopes scopes;
  Registrar r(app, scopes);

  r.option("--model", c.model,
           "model: mlp, cnn or resnet (sized by --data; resnet: three residual blocks with batch norm), lm "
           "(transformer on the bytes or tokens of --data FILE)")
      ->check(oneOf({"mlp", "cnn", "resnet", "lm"}))
      ->capture_default_str();
  r.option("--strategy", c.strategy,
           "one-device, mirrored (--replicas threads), multi-worker-mirrored (one replica per rank, under kolo "
           "run or --workers), central-storage, parameter-server (under kolo run --ps P --workers W), federated "
           "(server and client hosts, under kolo run -n N or in one process), pipeline (--stages P ranks under "
           "kolo run -n P), tensor (--tp T ranks under kolo run -n T) or fsdp (fully sharded data parallelism, "
           "one replica per rank under kolo run, see --shard)")
      ->check(oneOf({"one-device", "mirrored", "multi-worker-mirrored", "central-storage", "parameter-server",
                     "federated", "pipeline", "tensor", "fsdp"}))
      ->capture_default_str();
  r.option("--workers", flags.workers,
           "run on N ranks of this machine, as kolo run -n N -- kolo train --strategy "
           "multi-worker-mirrored ... (or the --strategy fsdp given)")
      ->check(atLeast(1));
  r.option("--epochs", c.epochs, "epochs (default 10)")->check(atLeast(1));
  r.option("--steps", c.steps, "total optimizer steps; stops early (0: all epochs)")->check(atLeast(0));
  r.option("--batch", c.batch,
           "batch size (lm: default 16; parameter-server: each worker's, default 64)")
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--accumulate", c.accumulate,
           "gradient accumulation: each replica takes its part of every --batch as K micro-batches, forward and "
           "backward one after the other, and the gradients travel once, after the last (DDP's no_sync; fsdp "
           "reduce-scatters each micro-batch's into the sharded sum)",
           {"one-device", "mirrored", "multi-worker-mirrored", "central-storage", "fsdp"})
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--optimizer", c.optimizer, "sgd, adam or adamw (default sgd)")->check(oneOf({"sgd", "adam", "adamw"}));
  r.option("--lr", c.lr,
           "learning rate (default recipe: 0.1 mlp and resnet / 0.05 cnn; --optimizer sgd: 0.05 / 0.02; adam: 1e-3)")
      ->check(above(0));
  r.option("--momentum", c.momentum, "SGD momentum (default 0.9)")->check(notBelow(0));
  r.flag("--nesterov", c.nesterov, "Nesterov momentum (sgd)");
  r.option("--beta1", c.beta1, "decay of Adam's running mean of the gradient (adam, adamw; default 0.9)")
      ->check(notBelow(0));
  r.option("--weight-decay", c.weightDecay, "weight decay (default 0; adamw 0.01)")->check(notBelow(0));
  r.option("--schedule", c.schedule,
           "lr schedule: auto (warm-up + cosine without --lr, constant with it), constant, cosine, warmup-cosine, "
           "step; or the pipeline schedule: gpipe, 1f1b")
      ->check(oneOf({"auto", "constant", "cosine", "warmup-cosine", "step", "gpipe", "1f1b"}))
      ->capture_default_str();
  r.option("--warmup-steps", c.warmupSteps, "warm-up steps (default half an epoch)")->check(atLeast(0));
  r.option("--clip-norm", c.clipNorm, "clip the gradient's global norm to this (0: off; one-device and fsdp)",
           {"one-device", "fsdp"})
      ->check(notBelow(0));
  r.option("--seed", c.seed, "seed of initialisation and shuffling")->capture_default_str();
  r.flag(
      "--no-shuffle", [&c] { c.shuffle = false; },
      "train in file order: step s uses samples s*B ... (s+1)*B-1 (lm: the windows at bytes "
      "(s*B+i)*seq-len "
      "of the text's first 90%, from the start again after its last full batch)");
  r.flag("--drop-last", c.dropLast, "drop a last global batch shorter than --batch (the default)");
  r.flag(
      "--pad-last", [&c] { c.dropLast = false; },
      "pad a last short global batch with samples from the epoch's start");
  r.option("--train-limit", c.data.trainLimit, "train on the first N training samples only, reading no further (0: all)")
      ->check(atLeast(0));
  r.option("--data", c.data.path,
           "training data: the directory of the Fashion-MNIST *-ubyte.gz files, a .csv/.tsv table with a header "
           "(--label-column), .npy inputs (--labels), an .npz archive (arrays x and y), a folder of images per class "
           "(DIR/CLASS/*.png|jpg), shards of .npz or .csv files ('DIR/*.npz' or a comma-separated list); --model "
           "lm: a text, or a token file with --token-dtype")
      ->capture_default_str();
  r.option("--test-data", c.data.testPath,
           "the test split, of the same kind as --data (default: a seeded tenth of --data held out; --model lm: the "
           "last tenth of --data)");
  r.option("--label-column", c.data.labelColumn, "the header's name of a table's label column (integers, or strings "
           "mapped to classes in sorted order)")
      ->capture_default_str();
  r.option("--labels", c.data.labelsPath, "the labels of .npy inputs in --data (.npy of integers)");
  r.option("--test-labels", c.data.testLabelsPath, "the labels of .npy inputs in --test-data");
  r.flag(
      "--no-standardize", [&c] { c.data.standardize = false; },
      "keep a table's or arrays' features as they are (default: each standardised with the training split's mean "
      "and standard deviation, stored with checkpoints and --save)");
  r.flag(
      "--no-augment", [&c] { c.data.augment = false; },
      "train on an image folder's images as they are (default: a random crop with 4 pixels of padding and a "
      "horizontal flip per image and epoch, drawn from --seed)");
  r.option("--image-size", c.data.imageSize,
           "resize an image folder's images to N x N or H x W (bilinear), e.g. 32 or 64x48 (default: every image "
           "must have the first one's size)");
  r.option("--token-dtype", c.tokenType, "--data is a token file of little-endian u8, u16 or u32 tokens (nanoGPT's "
           "train.bin: u16)", kLm)
      ->check(oneOf({"u8", "u16", "u32"}));
  r.option("--vocab", c.vocab, "the token file's vocabulary (default: its largest token + 1)", kLm)->check(atLeast(1));
  r.option("--init", c.initPath, "start from these weights (safetensors)");
  r.option("--save", c.savePath, "write the final weights here (safetensors)");
  r.option("--threads", c.threads, "OpenBLAS threads")->capture_default_str()->check(atLeast(1));
  r.option("--precision", c.precision,
           "matrix products: f32, or bf16 (bf16 operands, f32 sums; weights, gradients and optimizer state stay "
           "f32)")
      ->check(oneOf({"f32", "bf16"}))
      ->capture_default_str();
  r.option("--prefetch", c.prefetch,
           "a loader thread gathers the next batches while a step runs: on, off, auto (on when the node has a "
           "core to spare; off gathers on the training thread)")
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  r.flag("--recompute", c.recompute,
         "activation checkpointing: keep only each top-level layer's input (pipeline: each micro-batch's stage "
         "input) and compute its forward again before its backward",
         {"pipeline", "one-device", "mirrored", "central-storage", "multi-worker-mirrored", "fsdp"});
  r.option("--memory-limit", c.memoryLimit,
           "tensor memory budget of each rank, e.g. 512M: an allocation past it ends the run with an error naming "
           "the tensor and the bytes");

  r.group("Data parallel");
  r.option("--replicas", c.replicas, "replicas in this process (mirrored, central-storage)",
           {"mirrored", "central-storage"})
      ->capture_default_str()
      ->check(atLeast(1));
  r.flag("--sync-bn", c.syncBatchNorm,
         "synchronised batch norm: every batch norm normalises with the statistics of the whole global batch "
         "over the replicas (one all-reduce per layer in forward and one in backward), so N replicas train as one "
         "device on the global batch; without it each replica normalises with its own share",
         {"mirrored", "multi-worker-mirrored", "central-storage", "fsdp"});
  r.option("--reduction", c.reduction,
           "in-process gradient reduction of mirrored: reduce-to-one, hierarchical-copy, ring", {"mirrored"})
      ->check(oneOf({"reduce-to-one", "hierarchical-copy", "ring"}))
      ->capture_default_str();
  r.option("--algo,--algorithm", c.algorithm,
           "all-reduce algorithm of multi-worker-mirrored: auto, ring, hierarchical, tree, halving-doubling, "
           "reduce-broadcast; of federated: fedavg, fedprox")
      ->check(oneOf({"auto", "ring", "hierarchical", "tree", "halving-doubling", "reduce-broadcast", "fedavg",
                     "fedprox"}))
      ->capture_default_str();
  r.option("--bucket-mb", c.bucketMb, "gradient bucket capacity in MiB", kReducer)
      ->capture_default_str()
      ->check(above(0));
  r.option("--first-bucket-mb", c.firstBucketMb, "capacity of the first gradient bucket in MiB", kReducer)
      ->capture_default_str()
      ->check(above(0));
  r.option("--overlap", c.overlap,
           "start bucket all-reduces during backward: on, off, auto (on when the node has a core to spare for "
           "communication)",
           kReducer)
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  r.option("--shard-optimizer", c.shardOptimizer,
           "multi-worker-mirrored on one host: each rank averages and applies its share of the update from the "
           "others' gradients in shared memory, then copies the other shares of the weights (ZeRO stage 1); "
           "auto: when --algo is auto and buckets are not overlapped with backward",
           kReducer)
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  r.option("--compress", c.compress,
           "gradient compression of multi-worker-mirrored: none, fp16, bf16, powersgd:RANK, topk:FRACTION "
           "(docs/efficiency.md)",
           kMultiWorker,
           " (parameter-server workers compress with --ps-compress; kolo train --help lists the flags of each "
           "strategy)")
      ->capture_default_str();
  CLI::Option* balance = r.flag("--balance", c.balance,
                                "multi-worker-mirrored: split each global batch over the ranks in proportion to "
                                "their measured speed, the losses weighted by the shares (docs/elastic.md)",
                                kMultiWorker);
  r.option("--balance-every", c.balanceEvery, "--balance: steps between re-plans of the split", kMultiWorker)
      ->capture_default_str()
      ->check(atLeast(1))
      ->needs(balance);

  r.group("Fully sharded data parallel");
  r.option("--shard", c.shard,
           "fsdp: grad shards gradients and optimizer state (ZeRO-2), full shards the parameters too and gathers "
           "them per top-level layer (ZeRO-3)",
           kFsdp)
      ->check(oneOf({"grad", "full"}))
      ->capture_default_str();
  r.option("--shard-group", c.shardGroup,
           "fsdp: shard over groups of N consecutive ranks and replicate across the groups (HSDP: gradients "
           "reduce-scattered in the group, then all-reduced across); 0: one group of every rank",
           kFsdp)
      ->check(atLeast(0));
  r.option("--unit-params", c.unitParams,
           "fsdp: a unit (what is gathered and reduce-scattered at once) takes consecutive top-level layers until "
           "it holds at least N parameters; fewer units, fewer collectives, a larger gathered unit; 0: one unit "
           "per layer",
           kFsdp)
      ->check(atLeast(0))
      ->capture_default_str();
  r.flag("--hsdp", c.hsdp, "fsdp: shard within each host, replicate across hosts (--shard-group of the ranks per host)",
         kFsdp);

  r.group("Parameter server");
  train::ParameterServerOptions& p = c.ps;
  r.parsed("--ps-mode", p.mode, parallel::ps::parseMode,
           "parameter-server updates: sync (mean of every worker's gradient), async (applied on arrival), ssp "
           "(async, no worker more than --staleness ahead)",
           kPs, "sync")
      ->check(oneOf({"sync", "async", "ssp"}));
  r.option("--staleness", p.staleness, "ssp: how many pushes a worker may be ahead of the slowest", kPs)
      ->check(atLeast(0))
      ->capture_default_str();
  r.option("--ps-shard-bytes", p.shardBytes, "parameter-server: parameters larger than this are split over the servers",
           kPs)
      ->check(atLeast(1))
      ->capture_default_str();
  r.parsed("--ps-compress", p.compression, parallel::ps::parseCompression,
           "parameter-server: none, or bf16 or fp16 for the gradients workers push and the parameters they pull "
           "(half the bytes; the servers keep f32)",
           kPs, "none")
      ->check(oneOf({"none", "bf16", "fp16"}));
  r.parsed("--ps-transport", p.sharedMemory, [](const std::string& value) { return value != "tcp"; },
           "parameter-server: auto (values through shared memory between a worker and a server on the same host, "
           "TCP otherwise) or tcp (TCP always)",
           kPs, "auto")
      ->check(oneOf({"auto", "tcp"}));
  r.seconds("--ps-heartbeat-seconds", p.heartbeat,
            "parameter-server: a worker that sends no heartbeat for this long (stopped, hung) is lost and its data "
            "goes to the others (0: off)",
            kPs)
      ->check(atLeast(0));
  r.parsed("--ps-staleness-lr", p.stalenessLr, onOffAuto,
           "parameter-server async/ssp: divide a gradient by its staleness (the updates since the version it was "
           "computed on), auto: on in async and ssp",
           kPs, "auto")
      ->check(oneOf({"auto", "on", "off"}));
  r.parsed("--ps-overlap", p.overlap, onOffAuto,
           "parameter-server async/ssp: a worker computes its next step while the previous push and pull are in "
           "flight (on two replicas of the model); auto: on in async and ssp when a server is reached over TCP "
           "(not through shared memory on its host) or --ps-lookahead is given",
           kPs, "auto")
      ->check(oneOf({"auto", "on", "off"}));
  r.option("--ps-lookahead", p.lookahead,
           "parameter-server, overlapped: a step computes on the newest values carried on by this factor times "
           "their change since the previous reply (0: off; default 1.5 with async's and ssp's Adam defaults, else "
           "0)",
           kPs)
      ->check(notBelow(0));
  r.option("--ps-unit-batches", p.unitBatches, "parameter-server: batches per unit of data the chief hands to a worker",
           kPs)
      ->check(atLeast(1))
      ->capture_default_str();

  r.group("Federated (--strategy federated)");
  parallel::fed::FederatedOptions& f = c.federated;
  r.option("--clients", f.clients, "simulated clients", kFederated)->capture_default_str()->check(atLeast(1));
  r.option("--clients-per-round", f.clientsPerRound, "clients sampled each round (K)", kFederated)->check(atLeast(1));
  r.option("--client-fraction", c.clientFraction,
           "fraction of the clients sampled each round, without --clients-per-round", kFederated)
      ->capture_default_str()
      ->check(above(0));
  r.option("--rounds", c.rounds, "communication rounds", kFederated)->capture_default_str()->check(atLeast(1));
  r.option("--local-epochs", f.client.localEpochs, "epochs each client trains per round (E)", kFederated)
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--local-batch", f.client.localBatch,
           "client batch size (B); 0: the client's whole data (FedSGD with E = 1)", kFederated)
      ->capture_default_str()
      ->check(atLeast(0));
  r.option("--prox-mu", f.client.proxMu, "FedProx proximal weight mu (--algorithm fedprox)", kFederated)
      ->check(notBelow(0));
  r.option("--server-lr", f.serverLr, "server step on the mean update", kFederated)
      ->capture_default_str()
      ->check(above(0));
  r.option("--partition", c.partition, "iid, shards:S or dirichlet:ALPHA", kFederated)->capture_default_str();
  r.seconds("--round-timeout", f.roundTimeout,
            "seconds the server waits for a round's updates; later ones are left out", kFederated)
      ->check(above(0));
  r.flag("--secure-agg", f.secureAgg, "secure aggregation (Bonawitz et al. 2017): the server learns only the sum",
         kFederated);
  r.option("--sa-threshold", f.saThreshold,
           "secure aggregation: shares needed to recover a dropped client's masks (default: a majority of K)",
           kFederated)
      ->check(atLeast(1));
  r.option("--dp-clip", f.dpClip, "DP-FedAvg: clip each client's update to this L2 norm", kFederated)->check(above(0));
  r.option("--dp-noise", f.dpNoise, "DP-FedAvg: Gaussian noise multiplier sigma (std sigma * clip on the sum)",
           kFederated)
      ->check(notBelow(0));
  r.option("--dp-delta", f.dpDelta, "DP-FedAvg: delta of the reported epsilon", kFederated)
      ->capture_default_str()
      ->check(above(0));

  r.group("Model parallel and the lm");
  r.option("--layers", c.layers, "lm: transformer blocks", kLm)->capture_default_str()->check(atLeast(1));
  r.option("--d-model", c.dModel, "lm: embedding width", kLm)->capture_default_str()->check(atLeast(1));
  r.option("--heads", c.heads, "lm: attention heads (must divide --d-model)", kLm)
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--arch", c.arch,
           "lm: gpt (learned positions, LayerNorm, GELU MLP, biases) or llama (rotary positions, RMSNorm, "
           "grouped-query attention, SwiGLU, no biases, tied embeddings)",
           kLm)
      ->capture_default_str()
      ->check(CLI::IsMember({"gpt", "llama"}));
  r.option("--kv-heads", c.kvHeads, "lm, llama: key/value heads (must divide --heads; default: --heads)", kLm)
      ->check(atLeast(1));
  r.option("--seq-len", c.seqLen, "lm: context length in bytes", kLm)->capture_default_str()->check(atLeast(1));
  r.option("--sample-bytes", c.sampleBytes, "lm: bytes of text generated at the end", kLm)
      ->capture_default_str()
      ->check(atLeast(0));
  r.option("--stages", c.stages, "pipeline: stages, one rank each (run under kolo run -n STAGES)", {"pipeline"})
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--tp", c.tp, "tensor: ranks the split layers are spread over (run under kolo run -n TP)")
      ->capture_default_str()
      ->check(atLeast(1));
  r.flag("--sequence-parallel", c.sequenceParallel,
         "tensor, lm: LayerNorms and residuals hold seq-len/tp of the tokens on each rank (all-gather before the "
         "column-parallel layers, reduce-scatter after the row-parallel ones)",
         {"tensor", "pipeline"});
  r.option("--mesh", c.mesh,
           "hybrid: dp=D,pp=P (D replicas of a P-stage pipeline) or dp=D,tp=T; gradients are averaged between "
           "replicas (with --strategy fsdp and dp=D,tp=T, the replicas shard each tensor rank's part again); run "
           "under kolo run -n D*P (or D*T)");
  r.option("--micro-batches", c.microBatches, "pipeline: micro-batches per step (--batch must be a multiple)",
           {"pipeline", "lm"})
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--pipeline-schedule", c.pipelineSchedule,
           "pipeline: gpipe or 1f1b (also --schedule gpipe|1f1b, when no lr schedule is named)", {"pipeline", "lm"})
      ->check(oneOf({"gpipe", "1f1b"}))
      ->capture_default_str();
  r.option("--split-at", c.splitAt,
           "pipeline: first layer of stages 2..P, e.g. 3,6 (default: split by measured layer cost)", {"pipeline"});

  r.group("Checkpoints");
  r.option("--checkpoint-dir", c.checkpointDir, "write checkpoints here (every --checkpoint-every steps and at the end)");
  r.option("--checkpoint-every", c.checkpointEvery, "steps between checkpoints (0: only at the end)")->check(atLeast(0));
  r.option("--keep-checkpoints", c.keepCheckpoints, "checkpoints kept")->capture_default_str()->check(atLeast(1));
  r.option("--resume", c.resumeDir, "continue from the newest good checkpoint in DIR (--steps stays the total)");

  r.group("Metrics and checks");
  r.option("--metrics", c.metricsPath, "write metrics here (JSON lines)");
  r.option("--metrics-every", c.metricsEvery,
           "steps between the ranks' step-time exchange: an interval line in --metrics and the breakdown on the "
           "progress line")
      ->capture_default_str()
      ->check(atLeast(1));
  r.option("--timeline", c.timelineDir,
           "record every rank's timeline into DIR, merged into DIR/trace.json (Chrome trace; also "
           "KOLO_TIMELINE=DIR)");
  r.option("--status-file", c.statusFile,
           "each rank keeps its step and state in FILE.rank-N (kolo status FILE); default KOLO_STATUS_FILE",
           {"one-device", "mirrored", "central-storage", "multi-worker-mirrored", "fsdp", "pipeline", "tensor", "lm",
            "parameter-server", "federated"});
  r.option("--timing-skip", c.timingSkip, "steps left out of the steady-state samples/s")
      ->capture_default_str()
      ->check(atLeast(0));
  r.flag("--detect-anomaly", c.detectAnomaly,
         "check every module's output and gradient for NaN and infinity; stop at the first, naming "
         "the rank, step "
         "and module (slower: a pass over every activation; mirrored: replica 0)",
         kWatched, kWatchedHint);
  r.option("--check-sync", c.checkSync,
           "every N steps compare a hash of every rank's weights; stop naming the ranks that differ and the first "
           "tensor (0: off)",
           kMultiWorker, ": it compares the weights of several ranks (under kolo run, or --workers N)")
      ->check(atLeast(0));
  r.flag(
      "--progress", [&c] { c.progress = 1; }, "always draw a progress bar");
  r.flag(
      "--no-progress", [&c] { c.progress = std::max(c.progress, 0); },
      "plain progress lines even on a terminal");
  r.flag("--quiet", c.quiet, "no progress output");

  // Test and benchmark hooks: no help lines. Ranks are launch ranks.
  r.group(kHidden);
  r.option("--fail-at-step", flags.failAt, "STEP[:RANK] inject a failure before STEP on RANK (default 0)");
  r.option("--debug-slow-worker,--debug-slow-rank", flags.slowRank,
           "WORKER:FACTOR parameter-server worker WORKER (or rank WORKER of the other strategies, the launch rank "
           "under kolo run --elastic) takes FACTOR times as long per step");
  r.option("--debug-kill-rank", flags.killRank,
           "RANK[,RANK...]:STEP[:KILL|:STOP] those launch ranks SIGKILL (or SIGSTOP) themselves before STEP "
           "(parameter-server workers: before their push STEP; federated client hosts: before round STEP)");
  r.option(
      "--debug-nan-at", flags.nanAt,
      "STEP:RANK:MODULE[:grad] write a NaN into MODULE's output (or its gradient) at STEP on RANK",
      kWatched, kWatchedHint);
  r.option("--debug-perturb", flags.perturb, "STEP:RANK:TENSOR add 1e-3 to one weight of TENSOR before STEP on RANK",
           {"one-device", "mirrored", "central-storage", "multi-worker-mirrored"});
  r.option("--debug-kill-in-regroup", c.faults.elastic.killInRegroup,
           "RANK: that rank SIGKILLs itself in the first membership change (members agreed, communicator not "
           "built)",
           kElastic);
  r.option("--debug-await-join", c.faults.elastic.awaitJoinAt,
           "STEP: before STEP the members wait for ranks to register to join (up to --max-ranks)", kElastic);
  r.option("--debug-sample-log", c.faults.elastic.sampleLog,
           "each rank appends the sample ids of its completed steps to FILE.rank-N", kElastic);
  r.option("--debug-drop-rate", f.simulatedDropRate, "each selected client drops out with this probability", kFederated)
      ->check(notBelow(0));
  return scopes;
}

void TrainFlags::finish(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options())
    if (option->count() > 0 && !option->get_lnames().empty())
      config.givenFlags.insert("--" + option->get_lnames().front());
  if (config.schedule == "gpipe" || config.schedule == "1f1b") {
    config.pipelineSchedule = config.schedule;
    config.schedule = "auto";
  }
  if (!config.resumeDir.empty() && config.checkpointDir.empty()) config.checkpointDir = config.resumeDir;
  // Without --strategy, a rank of a job of several (kolo run -n N, torchrun, mpirun, srun)
  // trains its share of the global batch as multi-worker-mirrored, as a DDP script does under
  // torchrun, instead of N one-device runs that ignore each other; alone, on one device. The
  // job shapes that name their own layout keep theirs: --mesh, --stages, --tp, the lm (one
  // stage), an elastic launch.
  if (!config.givenFlags.count("--strategy") && config.mesh.empty() && config.stages == 1 && config.tp == 1 &&
      config.model != "lm" && !parallel::ElasticContext::launchedElastic() && comm::detectLaunch().size > 1)
    config.strategy = "multi-worker-mirrored";
  train::FaultPlan& faults = config.faults;
  if (!failAt.empty()) faults.fail = train::FaultPlan::parseFail(failAt, "--fail-at-step");
  if (!slowRank.empty()) faults.slow = train::FaultPlan::parseSlow(slowRank, "--debug-slow-rank");
  if (!killRank.empty()) faults.kill = train::FaultPlan::parseKill(killRank, "--debug-kill-rank");
  if (!nanAt.empty()) faults.nan = train::FaultPlan::parseNan(nanAt, "--debug-nan-at");
  if (!perturb.empty()) faults.perturb = train::FaultPlan::parsePerturb(perturb, "--debug-perturb");
}

std::string effectiveStrategy(const TrainConfig& config) {
  if (config.mesh.empty()) return config.strategy;
  const parallel::MeshShape shape = parallel::parseMeshShape(config.mesh);
  if (config.strategy == "fsdp" || config.shardReplicas) return "fsdp";  // fsdp over the replicas
  return shape.pp == 1 && shape.tp > 1 ? "tensor" : "pipeline";
}

void checkFlagScopes(const FlagScopes& scopes, const TrainConfig& config) {
  std::vector<std::string> run = {effectiveStrategy(config)};
  if (config.model == "lm") run.push_back("lm");
  if (parallel::ElasticContext::launchedElastic()) run.push_back("elastic");
  for (const FlagScope& scope : scopes) {
    if (!config.givenFlags.count(scope.flag)) continue;
    if (std::any_of(scope.where.begin(), scope.where.end(),
                    [&](const std::string& w) { return std::find(run.begin(), run.end(), w) != run.end(); }))
      continue;
    KOLO_THROW(InvalidArgument, scope.flag, " applies to ", described(scope.where), ", not to ", described({run.front()}),
               scope.hint.empty() ? " (kolo train --help lists the flags of each strategy)" : scope.hint);
  }
}

std::string flagScopesText(const FlagScopes& scopes) {
  // One line per set of strategies, in the order the table first names it.
  std::vector<std::pair<Where, std::vector<std::string>>> rows;
  for (const FlagScope& scope : scopes) {
    if (scope.flag.rfind("--debug-", 0) == 0) continue;  // test hooks stay hidden
    auto row = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == scope.where; });
    if (row == rows.end()) row = rows.insert(rows.end(), {scope.where, {}});
    row->second.push_back(scope.flag);
  }
  std::ostringstream text;
  text << "Flags that only some strategies accept (given with another, they are refused):\n";
  for (const auto& [where, flags] : rows) text << "  " << described(where) << ":\n    " << listWords(flags, ", ") << "\n";
  return text.str();
}

}  // namespace kolo::cli
