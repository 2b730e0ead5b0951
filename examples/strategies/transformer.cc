// run: kolo run -n 2 -- ./transformer --steps 10 --compare
// A transformer language model of your own, data- or model-parallel: a GPT-style decoder
// defined here (token and learned position embeddings, kolo::nn::TransformerBlock layers, a
// final LayerNorm and an untied head), trained on the bytes of a text file in file order
// (data::ByteCorpus: row i of step s is the window at byte (s*B + i)*T, as another program
// can read them) with AdamW by train::fit over a train::DataParallelEngine, one replica per
// rank (multi-worker-mirrored, or fully sharded with --fsdp; one-device when started alone),
// or by a train::ModelParallelEngine with --tp T and/or --pp P: its blocks split over T ranks
// (attention by heads, the MLP column- then row-parallel), cut into P pipeline stages, the
// job's other ranks replicas.
// --recompute keeps only each block's input and computes the block again in backward;
// --precision bf16 takes every product with bf16 operands and f32 sums (weights, gradients
// and AdamW's state stay f32). With --compare it also trains the same model on one device in
// the same job, on the same batches and in the same precision, and its last line gives both
// held-out losses, their relative gap, and the weights' `max relative difference D`: the
// largest |distributed - one device| / max|one device| of any tensor.
// Options: --steps N (default 10), --batch B (global, default 16), --layers L (2), --width C
// (64), --heads H (4), --seq-len T (32), --lr LR (1e-3), --text FILE (default the GPL's text),
// --fsdp, --tp T, --pp P, --recompute, --precision f32|bf16, --compare. Exit status 1 when
// the loss gap is above 1e-5 (bf16: 1e-4) or, in f32, D above 1e-3 (or on an error). AdamW
// moves a weight by about lr whatever the size of its gradient, so where the gradient is
// rounding noise in both runs (the key third of qkv's bias, whose true gradient is zero:
// softmax ignores a score added to a whole row) each run walks its own way: D is 2e-4 in f32
// after 10 steps, and up to 5e-2 in bf16, where the noise is larger; the losses agree to
// 1e-7 and 2e-6.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kolo/byte_corpus.h"
#include "kolo/error.h"
#include "kolo/nn/attention.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/distributed.h"
#include "kolo/precision.h"
#include "kolo/threads.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"

namespace {

constexpr int64_t kVocab = 256;  // bytes

struct Config {
  int64_t layers = 2, width = 64, heads = 4, seqLen = 32;
};

// Token embeddings plus a learned embedding of each position: (B, T) bytes -> (B, T, C).
struct TokensAndPositions : kolo::nn::Module {
  TokensAndPositions(const Config& config, kolo::Generator& gen) {
    tokens = registerModule("tokens", std::make_shared<kolo::nn::Embedding>(kVocab, config.width, gen));
    positions = registerParameter("positions", kolo::Tensor::randn({config.seqLen, config.width}, gen, 0.0, 0.02));
  }
  kolo::Tensor forward(const kolo::Tensor& bytes) override {
    const int64_t t = bytes.shape()[1];
    return kolo::add((*tokens)(bytes), positions.slice(0, 0, t));
  }
  std::shared_ptr<kolo::nn::Embedding> tokens;
  kolo::Tensor positions;
};

// The decoder as a Sequential of its top-level layers: what activation checkpointing
// (DataParallelOptions::recompute) and fsdp's units are made of.
std::shared_ptr<kolo::nn::Sequential> makeDecoder(const Config& config) {
  kolo::Generator gen(1);  // every replica alike (the engine also copies rank 0's)
  auto model = std::make_shared<kolo::nn::Sequential>();
  model->add(std::make_shared<TokensAndPositions>(config, gen));
  for (int64_t i = 0; i < config.layers; ++i)
    model->add(std::make_shared<kolo::nn::TransformerBlock>(config.width, config.heads, gen));
  model->add(std::make_shared<kolo::nn::LayerNorm>(kolo::Shape{config.width}));
  model->add(std::make_shared<kolo::nn::Linear>(config.width, kVocab, gen));  // (B, T, 256)
  return model;
}

struct Run {
  Config config;
  int64_t steps = 10, batch = 16;
  double lr = 1e-3;
  bool recompute = false;
};

kolo::parallel::OptimizerFactory adamw(double lr) {
  return [lr](const kolo::parallel::NamedTensors& parameters) {
    return kolo::optim::makeAdamW(parameters, {.lr = lr, .weightDecay = 0.01});
  };
}

// Data parallelism with `strategy`: every rank holds the whole decoder (or, under fsdp, its
// shards). The loss is the default, crossEntropy of the scores (B, T, 256) against the next
// bytes (B, T): the mean over every position of every row, in training as in fit's evaluation.
std::unique_ptr<kolo::train::Engine> dataParallel(kolo::parallel::StrategyOptions strategy, const Run& run) {
  kolo::train::DataParallelOptions distribution;
  distribution.strategy = std::move(strategy);
  distribution.recompute = run.recompute;
  return std::make_unique<kolo::train::DataParallelEngine>([config = run.config] { return makeDecoder(config); },
                                                           adamw(run.lr), distribution);
}

// The decoder cut into `mesh.pp` pipeline stages (two micro-batches, 1F1B, cut by the layers'
// measured cost) whose blocks are split over `mesh.tp` ranks (attention by heads, the MLP
// column- then row-parallel), in `mesh.dp` replicas.
std::unique_ptr<kolo::train::Engine> modelParallel(std::shared_ptr<kolo::comm::Communicator> comm,
                                                   kolo::parallel::MeshShape mesh, const kolo::data::Dataset& train,
                                                   const Run& run) {
  kolo::train::ModelParallelOptions parallelism;
  parallelism.communicator = comm;
  parallelism.mesh = mesh;
  parallelism.recompute = run.recompute;
  if (mesh.pp > 1) {
    parallelism.microBatches = 2;
    std::vector<int64_t> rows(static_cast<size_t>(run.batch / mesh.dp / 2));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    parallelism.splitSample = train.gather(rows).inputs;  // one micro-batch, to time the layers on
  }
  return std::make_unique<kolo::train::ModelParallelEngine>([config = run.config] { return makeDecoder(config); },
                                                            adamw(run.lr), parallelism);
}

struct Trained {
  std::unique_ptr<kolo::train::Engine> engine;
  double heldOutLoss = 0.0;
};

// Trains `engine`, fresh, on `train`; the engine and its held-out loss.
Trained trainWith(std::unique_ptr<kolo::train::Engine> engine, std::shared_ptr<const kolo::data::Dataset> train,
                  std::shared_ptr<const kolo::data::Dataset> heldOut, const Run& run, bool report) {
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions options;
  options.steps = run.steps;
  options.batch = run.batch;
  options.shuffle = false;  // file order
  options.quiet = !report;
  options.progress = 0;
  if (!report) options.logger = &quietLogger;
  const kolo::train::FitSummary summary = kolo::train::fit(*engine, train, heldOut, options);
  if (report && engine->isPrimary())
    std::printf("%s: %lld steps, train loss %.4f, held-out loss %.4f\n", engine->name().c_str(),
                static_cast<long long>(summary.steps), summary.trainLoss, summary.validationLoss);
  return {std::move(engine), summary.validationLoss};
}

}  // namespace

int main(int argc, char** argv) try {
  Run run;
  bool fsdp = false, compare = false;
  kolo::parallel::MeshShape mesh{.dp = 1, .pp = 1, .tp = 1};
  std::string text = "/usr/share/common-licenses/GPL-3", precision = "f32";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) run.steps = std::atoll(argv[++i]);
    else if (arg == "--batch" && hasValue) run.batch = std::atoll(argv[++i]);
    else if (arg == "--layers" && hasValue) run.config.layers = std::atoll(argv[++i]);
    else if (arg == "--width" && hasValue) run.config.width = std::atoll(argv[++i]);
    else if (arg == "--heads" && hasValue) run.config.heads = std::atoll(argv[++i]);
    else if (arg == "--seq-len" && hasValue) run.config.seqLen = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) run.lr = std::atof(argv[++i]);
    else if (arg == "--text" && hasValue) text = argv[++i];
    else if (arg == "--precision" && hasValue) precision = argv[++i];
    else if (arg == "--tp" && hasValue) mesh.tp = std::atoi(argv[++i]);
    else if (arg == "--pp" && hasValue) mesh.pp = std::atoi(argv[++i]);
    else if (arg == "--fsdp") fsdp = true;
    else if (arg == "--recompute") run.recompute = true;
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  // The products' precision of this thread, for the whole run (torch.autocast's role).
  const kolo::MatmulPrecisionGuard products(kolo::parseMatmulPrecision(precision));
  const auto corpus = std::make_shared<const kolo::data::ByteCorpus>(text, run.config.seqLen);
  const auto train = std::make_shared<const kolo::data::ByteWindows>(corpus);
  const auto heldOut = std::make_shared<const kolo::data::ByteWindows>(corpus, true);

  // The job's ranks (kolo run sets the rank variables; alone: one rank): with --tp or --pp a
  // mesh of them, the rest replicas; otherwise one replica per rank.
  auto comm = kolo::parallel::init();
  const int modelRanks = mesh.tp * mesh.pp;
  KOLO_REQUIRE(modelRanks >= 1 && comm->size() % modelRanks == 0, "--tp ", mesh.tp, " x --pp ", mesh.pp,
               " does not divide the job's ", comm->size(), " ranks");
  std::unique_ptr<kolo::train::Engine> engine;
  if (modelRanks > 1) {
    mesh.dp = comm->size() / modelRanks;
    engine = modelParallel(comm, mesh, *train, run);
  } else {
    kolo::parallel::StrategyOptions strategy;
    strategy.kind = comm->size() == 1 ? kolo::parallel::StrategyKind::OneDevice
                    : fsdp            ? kolo::parallel::StrategyKind::FullyShardedDataParallel
                                      : kolo::parallel::StrategyKind::MultiWorkerMirrored;
    strategy.communicator = comm;
    engine = dataParallel(strategy, run);
  }
  Trained distributed = trainWith(std::move(engine), train, heldOut, run, true);
  if (!compare) return 0;

  // The same model, batches and precision on one device, in every rank's process; the whole
  // distributed weights on rank 0 (gathered from shards, stages and tensor ranks), which
  // compares and tells the others the verdict.
  kolo::parallel::StrategyOptions single;
  single.kind = kolo::parallel::StrategyKind::OneDevice;
  Trained oneDevice = trainWith(dataParallel(single, run), train, heldOut, run, false);
  distributed.engine->gatherModel();
  const bool bf16 = precision == "bf16";
  double verdict[3] = {0.0, 0.0, 1.0};  // max relative difference, loss gap, passed
  if (comm->rank() == 0) {
    verdict[0] = kolo::nn::maxRelativeDifference(distributed.engine->model(), oneDevice.engine->model());
    verdict[1] = std::fabs(distributed.heldOutLoss - oneDevice.heldOutLoss) / oneDevice.heldOutLoss;
    verdict[2] = verdict[1] <= (bf16 ? 1e-4 : 1e-5) && (bf16 || verdict[0] <= 1e-3) ? 1.0 : 0.0;
    std::printf("held-out loss %.6f, one device %.6f: relative gap %.2g; max relative difference %.3g\n",
                distributed.heldOutLoss, oneDevice.heldOutLoss, verdict[1], verdict[0]);
  }
  comm->broadcast(verdict, 3, kolo::DType::F64, 0);
  return verdict[2] == 1.0 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "transformer: %s\n", e.what());
  return 1;
}
