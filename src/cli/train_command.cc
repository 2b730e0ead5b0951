// `kolo train`: trains a built-in model (mlp, cnn, lm) on Fashion-MNIST (or a text file)
// with one of kolo's strategies; the flags map onto cli::TrainConfig and the runners of
// train_loop.h (the data-parallel strategies: train::fit over a train::DataParallelEngine). `--workers N` re-launches the command under `kolo run -n N`.
#include <malloc.h>

#include <cstdio>
#include <sstream>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/train_federated.h"
#include "cli/train_flags.h"
#include "cli/train_loop.h"
#include "kolo/byte_size.h"
#include "kolo/checkpoint.h"
#include "kolo/comm/init.h"
#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/parallel/elastic.h"
#include "kolo/precision.h"
#include "kolo/settings.h"
#include "kolo/train/fit.h"

namespace kolo::cli {
namespace {

// Training allocates and frees the same large activation and im2col buffers every step.
// glibc serves those with fresh mmap()s and returns freed heap tops to the kernel, so every
// step page-faults its buffers in again (a fifth of the CPU time of a cnn step). Keeping
// freed memory in the heap lets the next step reuse it.
void keepFreedMemory() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace

Command registerTrain(CLI::App& root) {
  auto config = std::make_shared<TrainConfig>();
  struct Raw {
    int64_t epochs = 0, warmup = 0;
    double lr = 0, momentum = 0, beta1 = 0, weightDecay = 0, lookahead = 0;
    std::string optimizer;
    bool noShuffle = false, bar = false, noBar = false, padLast = false;
    int workers = 0;
    std::string failAt, slowRank, killRank, nanAt, perturb;
  };
  auto raw = std::make_shared<Raw>();
  CLI::App* app = root.add_subcommand("train", "train a built-in model on Fashion-MNIST");
  app->add_option("--model", config->model,
                  "model: mlp or cnn (Fashion-MNIST), lm (byte-level transformer on --data FILE)")
      ->check(oneOf({"mlp", "cnn", "lm"}))
      ->capture_default_str();
  auto* epochs = app->add_option("--epochs", raw->epochs, "epochs (default 10)")->check(atLeast(1));
  app->add_option("--steps", config->steps, "total optimizer steps; stops early (0: all epochs)")
      ->check(atLeast(0));
  auto* batch =
      app->add_option("--batch", config->batch, "batch size (lm: default 16; parameter-server: each worker's, default 64)")->capture_default_str()->check(atLeast(1));
  auto* optimizer =
      app->add_option("--optimizer", raw->optimizer, "sgd, adam or adamw (default sgd)")
          ->check(oneOf({"sgd", "adam", "adamw"}));
  auto* lr = app->add_option("--lr", raw->lr,
                             "learning rate (default recipe: 0.1 mlp / 0.05 cnn; --optimizer sgd: "
                             "0.05 / 0.02; adam: 1e-3)")
                ->check(above(0));
  auto* momentum = app->add_option("--momentum", raw->momentum, "SGD momentum (default 0.9)")
                      ->check(notBelow(0));
  app->add_flag("--nesterov", config->nesterov, "Nesterov momentum (sgd)");
  auto* beta1 = app->add_option("--beta1", raw->beta1,
                                "decay of Adam's running mean of the gradient (adam, adamw; "
                                "default 0.9)")
                    ->check(notBelow(0));
  auto* weightDecay =
      app->add_option("--weight-decay", raw->weightDecay, "weight decay (default 0; adamw 0.01)")
          ->check(notBelow(0));
  app->add_option(
         "--schedule", config->schedule,
         "lr schedule: auto (warm-up + cosine without --lr, constant with it), constant, cosine, "
         "warmup-cosine, step; or the pipeline schedule: gpipe, 1f1b")
      ->check(oneOf({"auto", "constant", "cosine", "warmup-cosine", "step", "gpipe", "1f1b"}))
      ->capture_default_str();
  auto* warmup =
      app->add_option("--warmup-steps", raw->warmup, "warm-up steps (default half an epoch)")
          ->check(atLeast(0));
  app->add_option("--clip-norm", config->clipNorm,
                  "clip the gradient's global norm to this (0: off; one-device and fsdp)")
      ->check(notBelow(0));
  app->add_option("--seed", config->seed, "seed of initialisation and shuffling")
      ->capture_default_str();
  app->add_flag("--no-shuffle", raw->noShuffle,
                "train in file order: step s uses samples s*B ... (s+1)*B-1 (lm: the windows at bytes "
                "(s*B+i)*seq-len of the text's first 90%, from the start again after its last full batch)");
  app->add_option("--data", config->dataDir, "directory of the Fashion-MNIST *-ubyte.gz files")
      ->capture_default_str();
  app->add_option("--init", config->initPath, "start from these weights (safetensors)");
  app->add_option("--save", config->savePath, "write the final weights here (safetensors)");
  app->add_option("--metrics", config->metricsPath, "write metrics here (JSON lines)");
  app->add_option("--timeline", config->timelineDir,
                  "record every rank's timeline into DIR, merged into DIR/trace.json (Chrome "
                  "trace; also KOLO_TIMELINE=DIR)");
  app->add_option("--threads", config->threads, "OpenBLAS threads")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--precision", config->precision,
                  "matrix products: f32, or bf16 (bf16 operands, f32 sums; weights, gradients and "
                  "optimizer state stay f32)")
      ->check(oneOf({"f32", "bf16"}))
      ->capture_default_str();
  app->add_option("--strategy", config->strategy,
                  "one-device, mirrored (--replicas threads), multi-worker-mirrored (one replica "
                  "per rank, under kolo run or --workers), central-storage, parameter-server "
                  "(under kolo run --ps P --workers W), federated (server and client hosts, under kolo run -n N or "
                  "in one process), pipeline (--stages P ranks under kolo run -n P), "
                  "tensor (--tp T ranks under kolo run -n T) or fsdp (fully sharded data "
                  "parallelism, one replica per rank under kolo run, see --shard)")
      ->check(oneOf({"one-device", "mirrored", "multi-worker-mirrored", "central-storage",
                     "parameter-server", "federated", "pipeline", "tensor", "fsdp"}))
      ->capture_default_str();
  app->add_option("--shard", config->shard,
                  "fsdp: grad shards gradients and optimizer state (ZeRO-2), full shards the "
                  "parameters too and gathers them per top-level layer (ZeRO-3)")
      ->check(oneOf({"grad", "full"}))
      ->capture_default_str();
  app->add_option("--shard-group", config->shardGroup,
                  "fsdp: shard over groups of N consecutive ranks and replicate across the "
                  "groups (HSDP: gradients reduce-scattered in the group, then all-reduced "
                  "across); 0: one group of every rank")
      ->check(atLeast(0));
  app->add_option("--unit-params", config->unitParams,
                  "fsdp: a unit (what is gathered and reduce-scattered at once) takes "
                  "consecutive top-level layers until it holds at least N parameters; fewer "
                  "units, fewer collectives, a larger gathered unit; 0: one unit per layer")
      ->check(atLeast(0))
      ->capture_default_str();
  app->add_flag("--hsdp", config->hsdp,
                "fsdp: shard within each host, replicate across hosts (--shard-group of the "
                "ranks per host)");
  app->add_option("--workers", raw->workers,
                  "run on N ranks of this machine: re-launches itself as kolo run -n N -- kolo "
                  "train --strategy multi-worker-mirrored ... (or the --strategy fsdp given)")
      ->check(atLeast(1));
  app->add_option("--replicas", config->replicas,
                  "replicas in this process (mirrored, central-storage)")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option(
         "--reduction", config->reduction,
         "in-process gradient reduction of mirrored: reduce-to-one, hierarchical-copy, ring")
      ->check(oneOf({"reduce-to-one", "hierarchical-copy", "ring"}))
      ->capture_default_str();
  app->add_option("--algo,--algorithm", config->algorithm,
                  "all-reduce algorithm of multi-worker-mirrored: auto, ring, hierarchical, tree, "
                  "halving-doubling, reduce-broadcast; of federated: fedavg, fedprox")
      ->check(oneOf({"auto", "ring", "hierarchical", "tree", "halving-doubling", "reduce-broadcast",
                     "fedavg", "fedprox"}))
      ->capture_default_str();
  app->add_option("--bucket-mb", config->bucketMb, "gradient bucket capacity in MiB")
      ->capture_default_str()
      ->check(above(0));
  app->add_option("--first-bucket-mb", config->firstBucketMb,
                  "capacity of the first gradient bucket in MiB")
      ->capture_default_str()
      ->check(above(0));
  app->add_option("--overlap", config->overlap,
                  "start bucket all-reduces during backward: on, off, auto (on when the node has "
                  "a core to spare for communication)")
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_option("--shard-optimizer", config->shardOptimizer,
                  "multi-worker-mirrored on one host: each rank averages and applies its share "
                  "of the update from the others' gradients in shared memory, then copies the "
                  "other shares of the weights (ZeRO stage 1); auto: when --algo is auto and "
                  "buckets are not overlapped with backward")
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_option("--compress", config->compress,
                  "gradient compression of multi-worker-mirrored: none, fp16, bf16, "
                  "powersgd:RANK, topk:FRACTION (docs/efficiency.md)")
      ->capture_default_str();
  app->add_option("--prefetch", config->prefetch,
                  "a loader thread gathers the next batches while a step runs: on, off, auto (on "
                  "when the node has a core to spare; off gathers on the training thread)")
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_flag("--drop-last", config->dropLast,
                "drop a last global batch shorter than --batch (the default)");
  app->add_flag("--pad-last", raw->padLast,
                "pad a last short global batch with samples from the epoch's start");
  app->add_option("--train-limit", config->trainLimit,
                  "train on the first N training samples only, reading no further (0: all)")
      ->check(atLeast(0));
  app->add_option("--ps-mode", config->psMode,
                  "parameter-server updates: sync (mean of every worker's gradient), async "
                  "(applied on arrival), ssp (async, no worker more than --staleness ahead)")
      ->check(oneOf({"sync", "async", "ssp"}))
      ->capture_default_str();
  app->add_option("--staleness", config->staleness,
                  "ssp: how many pushes a worker may be ahead of the slowest")
      ->check(atLeast(0))
      ->capture_default_str();
  app->add_option("--ps-shard-bytes", config->psShardBytes,
                  "parameter-server: parameters larger than this are split over the servers")
      ->check(atLeast(1))
      ->capture_default_str();
  app->add_option("--ps-compress", config->psCompress,
                  "parameter-server: none, or bf16 or fp16 for the gradients workers push and "
                  "the parameters they pull (half the bytes; the servers keep f32)")
      ->check(oneOf({"none", "bf16", "fp16"}))
      ->capture_default_str();
  app->add_option("--ps-transport", config->psTransport,
                  "parameter-server: auto (values through shared memory between a worker and "
                  "a server on the same host, TCP otherwise) or tcp (TCP always)")
      ->check(oneOf({"auto", "tcp"}))
      ->capture_default_str();
  app->add_option("--ps-heartbeat-seconds", config->psHeartbeatSeconds,
                  "parameter-server: a worker that sends no heartbeat for this long (stopped, "
                  "hung) is lost and its data goes to the others (0: off)")
      ->check(atLeast(0))
      ->capture_default_str();
  app->add_option("--ps-staleness-lr", config->psStalenessLr,
                  "parameter-server async/ssp: divide a gradient by its staleness (the updates "
                  "since the version it was computed on), auto: on in async and ssp")
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_option("--ps-overlap", config->psOverlap,
                  "parameter-server async/ssp: a worker computes its next step while the "
                  "previous push and pull are in flight (on two replicas of the model); auto: "
                  "on in async and ssp when a server is reached over TCP (not through shared "
                  "memory on its host) or --ps-lookahead is given")
      ->check(oneOf({"auto", "on", "off"}))
      ->capture_default_str();
  auto* lookahead =
      app->add_option("--ps-lookahead", raw->lookahead,
                      "parameter-server, overlapped: a step computes on the newest values carried "
                      "on by this factor times their change since the previous reply (0: off; "
                      "default 1.5 with async's and ssp's Adam defaults, else 0)")
          ->check(notBelow(0));
  app->add_option("--ps-unit-batches", config->psUnitBatches,
                  "parameter-server: batches per unit of data the chief hands to a worker")
      ->check(atLeast(1))
      ->capture_default_str();
  app->add_option("--checkpoint-dir", config->checkpointDir,
                  "write checkpoints here (every --checkpoint-every steps and at the end)");
  app->add_option("--checkpoint-every", config->checkpointEvery,
                  "steps between checkpoints (0: only at the end)")
      ->check(atLeast(0));
  app->add_option("--keep-checkpoints", config->keepCheckpoints, "checkpoints kept")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--resume", config->resumeDir,
                  "continue from the newest good checkpoint in DIR (--steps stays the total)");
  app->add_option("--timing-skip", config->timingSkip,
                  "steps left out of the steady-state samples/s")
      ->capture_default_str()
      ->check(atLeast(0));
  app->add_option("--fail-at-step", raw->failAt,
                  "STEP[:RANK] inject a failure before STEP on RANK (default 0), for tests")
      ->group("");
  app->add_option("--debug-slow-worker,--debug-slow-rank", raw->slowRank,
                  "WORKER:FACTOR parameter-server worker WORKER (or rank WORKER of the other "
                  "strategies, the launch rank under kolo run --elastic) takes FACTOR times as "
                  "long per step, for benchmarks and tests")
      ->group("");
  auto* balance = app->add_flag("--balance", config->balance,
                                "multi-worker-mirrored: split each global batch over the ranks in "
                                "proportion to their measured speed, the losses weighted by the "
                                "shares (docs/elastic.md)");
  app->add_option("--balance-every", config->balanceEvery,
                  "--balance: steps between re-plans of the split")
      ->capture_default_str()
      ->check(atLeast(1))
      ->needs(balance);
  app->add_option("--debug-kill-rank", raw->killRank,
                  "RANK[,RANK...]:STEP[:KILL|:STOP] those launch ranks SIGKILL (or SIGSTOP) "
                  "themselves before STEP (parameter-server workers: before their push STEP; "
                  "federated client hosts: before round STEP), for tests")
      ->group("");
  app->add_option("--debug-kill-in-regroup", config->debugKillInRegroup,
                  "RANK under kolo run --elastic: that rank SIGKILLs itself in the first membership "
                  "change (members agreed, communicator not built), for tests")
      ->group("");
  app->add_option("--debug-await-join", config->debugAwaitJoin,
                  "STEP under kolo run --elastic: before STEP the members wait for ranks to "
                  "register to join (up to --max-ranks), so that they join there, for tests")
      ->group("");
  app->add_option("--debug-sample-log", config->debugSampleLog,
                  "under kolo run --elastic: each rank appends the sample ids of its completed "
                  "steps to FILE.rank-N, for tests")
      ->group("");
  app->add_flag("--detect-anomaly", config->detectAnomaly,
                "check every module's output and gradient for NaN and infinity; stop at the "
                "first, naming the rank, step and module (slower: a pass over every activation; "
                "mirrored: replica 0)");
  app->add_option("--check-sync", config->checkSync,
                  "every N steps compare a hash of every rank's weights; stop naming the ranks "
                  "that differ and the first tensor (0: off)")
      ->check(atLeast(0));
  app->add_option("--metrics-every", config->metricsEvery,
                  "steps between the ranks' step-time exchange: an interval line in --metrics "
                  "and the breakdown on the progress line")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--status-file", config->statusFile,
                  "each rank keeps its step and state in FILE.rank-N (kolo status FILE); "
                  "default KOLO_STATUS_FILE");
  app->add_option("--debug-nan-at", raw->nanAt,
                  "STEP:RANK:MODULE[:grad] write a NaN into MODULE's output (or its gradient) at "
                  "STEP on RANK, for tests")
      ->group("");
  app->add_option("--debug-perturb", raw->perturb,
                  "STEP:RANK:TENSOR add 1e-3 to one weight of TENSOR before STEP on RANK, for tests")
      ->group("");
  addModelParallelOptions(app, *config);
  std::shared_ptr<FederatedFlags> federated = addFederatedOptions(app);
  app->add_flag("--progress", raw->bar, "always draw a progress bar");
  app->add_flag("--no-progress", raw->noBar, "plain progress lines even on a terminal");
  app->add_flag("--quiet", config->quiet, "no progress output");
  app->footer(flagScopesText());

  Command command;
  command.app = app;
  command.warnsAtStart = [raw] { return raw->workers == 0; };  // --workers re-launches kolo
  command.run = [app, config, raw, federated, epochs, batch, optimizer, lr, momentum, beta1,
                 weightDecay, warmup, lookahead]() -> int {
    if (raw->workers > 0) execWorkers(raw->workers);
    for (const CLI::Option* option : app->get_options())
      if (option->count() > 0 && !option->get_lnames().empty())
        config->givenFlags.insert("--" + option->get_lnames().front());
    checkFlagScopes(*config);
    if (epochs->count()) config->epochs = raw->epochs;
    if (optimizer->count()) config->optimizer = raw->optimizer;
    if (lr->count()) config->lr = raw->lr;
    if (momentum->count()) config->momentum = raw->momentum;
    if (beta1->count()) config->beta1 = raw->beta1;
    if (lookahead->count()) config->psLookahead = raw->lookahead;
    if (weightDecay->count()) config->weightDecay = raw->weightDecay;
    if (warmup->count()) config->warmupSteps = raw->warmup;
    config->shuffle = !raw->noShuffle;
    config->batchGiven = batch->count() > 0;
    if (config->schedule == "gpipe" || config->schedule == "1f1b") {
      config->pipelineSchedule = config->schedule;
      config->schedule = "auto";
    }
    if (raw->padLast) config->dropLast = false;
    if (config->resumeDir.size() && config->checkpointDir.empty())
      config->checkpointDir = config->resumeDir;
    train::FaultPlan& faults = config->faults;
    if (!raw->failAt.empty()) faults.fail = train::FaultPlan::parseFail(raw->failAt, "--fail-at-step");
    if (!raw->slowRank.empty()) faults.slow = train::FaultPlan::parseSlow(raw->slowRank, "--debug-slow-rank");
    if (!raw->killRank.empty()) faults.kill = train::FaultPlan::parseKill(raw->killRank, "--debug-kill-rank");
    if (!raw->nanAt.empty()) faults.nan = train::FaultPlan::parseNan(raw->nanAt, "--debug-nan-at");
    if (!raw->perturb.empty()) faults.perturb = train::FaultPlan::parsePerturb(raw->perturb, "--debug-perturb");
    config->progress = raw->bar ? 1 : (raw->noBar ? 0 : -1);
    if (config->statusFile.empty()) config->statusFile = settings::statusFile();
    keepFreedMemory();
    if (!config->memoryLimit.empty()) setTensorMemoryLimit(static_cast<int64_t>(parseByteSize(config->memoryLimit)));
    observe::Logger logger(stderr);
    train::startTimeline(config->timelineDir);
    // Every strategy computes on this thread (or on replica threads that take its setting).
    const MatmulPrecisionGuard products(parseMatmulPrecision(config->precision));
    const bool modelParallel = config->strategy == "pipeline" || config->strategy == "tensor" || !config->mesh.empty();
    if (config->strategy == "parameter-server" || config->strategy == "federated")
      KOLO_REQUIRE(config->statusFile.empty(), "KOLO_STATUS_FILE is not available with --strategy ",
                   config->strategy);
    // The ranks of a model-parallel run hold different parts: no replicas to compare.
    if (modelParallel)
      KOLO_REQUIRE(!config->detectAnomaly && config->checkSync == 0,
                   "--detect-anomaly and --check-sync are not available with --strategy ", config->strategy);
    KOLO_REQUIRE(!config->detectAnomaly || config->model != "lm", "--detect-anomaly is not available with --model lm");
    KOLO_REQUIRE(config->model != "lm" || !parallel::ElasticContext::launchedElastic(),
                 "kolo run --elastic trains --model mlp or cnn, not lm");
    if (config->strategy == "parameter-server") return runParameterServerRole(*config, logger);
    if (config->strategy == "federated") return runFederated(*config, *federated, logger);
    if (modelParallel || config->model == "lm") return runModelParallel(*config, logger);
    if (parallel::ElasticContext::launchedElastic()) return runElasticTraining(*config, logger);
    return runDataParallel(*config, logger);
  };
  return command;
}

}  // namespace kolo::cli
