// run: kolo run -n 2 -- ./tensor_llama --tp 2 --steps 10 --compare
// Tensor parallelism for a LLaMA-style model of your own, by a plan written here: the
// decoder's classes are defined in this file (grouped-query attention over bias-free q, k, v
// and o projections with rotary positions, a SwiGLU mlp, RMSNorms, a token embedding and an
// untied head, blocks in an nn::Sequential so that a pipeline can cut them), and the plan
// names each module to split by its path (column-wise q, k, v and gate, up on head
// boundaries; row-wise o and down; the embedding and head by vocabulary, the loss never
// gathering the logits). train::fit drives a train::ModelParallelEngine over the bytes of a
// text file: --tp T splits every block over T ranks, --pp P cuts the decoder into P stages
// (kolo run -n 4 -- ./tensor_llama --tp 2 --pp 2), the job's other ranks are data-parallel
// replicas (kolo run -n 4 -- ./tensor_llama --tp 2: dp=2,tp=2). With --compare it also
// trains the same model on one device in the same job and its last line gives the weights'
// `max relative difference D` (the largest |split - one device| / max|one device| of any
// tensor, gathered on rank 0). Options: --steps N (default 10), --batch B (global, 8),
// --layers L (2), --width C (64), --heads H (4), --kv-heads K (2), --seq-len T (16), --lr LR
// (0.05, SGD), --text FILE (default the GPL's text), --tp T (2), --pp P (1),
// --sequence-parallel, --compare. Exit status 1 when D is above 1e-5 (or on an error).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kolo/byte_corpus.h"
#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/nn/llama.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/tensor_parallel.h"
#include "kolo/threads.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"

namespace {

constexpr int64_t kVocab = 256;  // bytes

struct Config {
  int64_t layers = 2, width = 64, heads = 4, kvHeads = 2, seqLen = 16;
  int64_t headDim() const { return width / heads; }
};

// Grouped-query attention: the head counts come from the projections' widths (so that a
// plan can give each rank some of the heads), rotary positions inside kolo's fused op.
class Attention : public kolo::nn::Module {
 public:
  Attention(const Config& config, kolo::Generator& gen) : headDim_(config.headDim()) {
    using kolo::nn::Linear;
    q_ = registerModule("q", std::make_shared<Linear>(config.width, config.heads * headDim_, gen, false));
    k_ = registerModule("k", std::make_shared<Linear>(config.width, config.kvHeads * headDim_, gen, false));
    v_ = registerModule("v", std::make_shared<Linear>(config.width, config.kvHeads * headDim_, gen, false));
    o_ = registerModule("o", std::make_shared<Linear>(config.heads * headDim_, config.width, gen, false));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {
    // The children through operator(): a plan's transforms (and any hook) run there.
    return (*o_)(kolo::causalAttention((*q_)(x), (*k_)(x), (*v_)(x), headDim_, kolo::Rotary{}));
  }

 private:
  int64_t headDim_;
  std::shared_ptr<kolo::nn::Linear> q_, k_, v_, o_;
};

// down(silu(gate(x)) * up(x)), bias-free.
class Mlp : public kolo::nn::Module {
 public:
  Mlp(const Config& config, kolo::Generator& gen) {
    using kolo::nn::Linear;
    const int64_t hidden = kolo::nn::swigluHidden(config.width);
    gate_ = registerModule("gate", std::make_shared<Linear>(config.width, hidden, gen, false));
    up_ = registerModule("up", std::make_shared<Linear>(config.width, hidden, gen, false));
    down_ = registerModule("down", std::make_shared<Linear>(hidden, config.width, gen, false));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {
    return (*down_)(kolo::swiglu((*gate_)(x), (*up_)(x)));
  }

 private:
  std::shared_ptr<kolo::nn::Linear> gate_, up_, down_;
};

// x + attn(attn_norm(x)), then + mlp(mlp_norm(.)).
class Block : public kolo::nn::Module {
 public:
  Block(const Config& config, kolo::Generator& gen) {
    attnNorm_ = registerModule("attn_norm", std::make_shared<kolo::nn::RMSNorm>(config.width));
    attn_ = registerModule("attn", std::make_shared<Attention>(config, gen));
    mlpNorm_ = registerModule("mlp_norm", std::make_shared<kolo::nn::RMSNorm>(config.width));
    mlp_ = registerModule("mlp", std::make_shared<Mlp>(config, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {
    const kolo::Tensor h = x + (*attn_)((*attnNorm_)(x));
    return h + (*mlp_)((*mlpNorm_)(h));
  }

 private:
  std::shared_ptr<kolo::nn::RMSNorm> attnNorm_, mlpNorm_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

// "0" the token embedding, "1" … "L" the blocks, "L+1" the final RMSNorm, "L+2" the head.
std::shared_ptr<kolo::nn::Sequential> makeDecoder(const Config& config) {
  kolo::Generator gen(1);  // every rank builds the same weights and keeps its shards
  auto model = std::make_shared<kolo::nn::Sequential>();
  model->add(std::make_shared<kolo::nn::Embedding>(kVocab, config.width, gen));
  for (int64_t i = 0; i < config.layers; ++i) model->add(std::make_shared<Block>(config, gen));
  model->add(std::make_shared<kolo::nn::RMSNorm>(config.width));
  model->add(std::make_shared<kolo::nn::Linear>(config.width, kVocab, gen, false));  // (B, T, 256)
  return model;
}

// The plan, by path ("*" spans dots): what PyTorch's parallelize_module takes as a dict.
kolo::parallel::TensorParallelPlan llamaPlan(const Config& config, bool sequenceParallel) {
  using namespace kolo::parallel;
  const int64_t headDim = config.headDim();
  const std::string last = std::to_string(config.layers + 1), head = std::to_string(config.layers + 2);
  return {.name = "example-llama",
          .styles = {{"0", vocabularyEmbedding()},
                     {"*.attn.q", columnWiseHeads(headDim)},
                     {"*.attn.k", columnWiseHeads(headDim)},
                     {"*.attn.v", columnWiseHeads(headDim)},
                     {"*.attn.o", rowWiseHeads(headDim)},
                     {"*.mlp.gate", columnWise()},
                     {"*.mlp.up", columnWise()},
                     {"*.mlp.down", rowWise()},
                     {"*_norm", sequenceNorm()},
                     {last, sequenceNorm()},
                     {head, vocabularyHead()}},
          .sequenceParallel = sequenceParallel};
}

struct Run {
  Config config;
  int64_t steps = 10, batch = 8;
  double lr = 0.05;
  bool sequenceParallel = false;
};

// Trains a fresh decoder over `comm` as `mesh` says (null: one device) and returns its engine.
std::unique_ptr<kolo::train::ModelParallelEngine> trainWith(
    std::shared_ptr<kolo::comm::Communicator> comm, kolo::parallel::MeshShape mesh,
    std::shared_ptr<const kolo::data::Dataset> train, const Run& run, bool report) {
  kolo::train::ModelParallelOptions parallelism;
  parallelism.communicator = comm;
  parallelism.mesh = mesh;
  if (mesh.tp > 1) parallelism.plan = llamaPlan(run.config, run.sequenceParallel);
  if (mesh.pp > 1) {
    parallelism.microBatches = 2;
    parallelism.splitAt = {1 + static_cast<int>(run.config.layers) / 2};  // half the blocks each
  }
  const double lr = run.lr;
  auto engine = std::make_unique<kolo::train::ModelParallelEngine>(
      [config = run.config] { return makeDecoder(config); },
      [lr](const kolo::parallel::NamedTensors& parameters) {
        return std::make_unique<kolo::optim::Sgd>(parameters, kolo::optim::SgdOptions{.lr = lr});
      },
      parallelism);
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions options;
  options.steps = run.steps;
  options.batch = run.batch;
  options.shuffle = false;  // file order
  options.quiet = !report;
  options.progress = 0;
  if (!report) options.logger = &quietLogger;
  const kolo::train::FitSummary summary = kolo::train::fit(*engine, train, nullptr, options);
  engine->gatherModel();  // the whole model on rank 0 (collective)
  if (report && engine->isPrimary())
    std::printf("%s: %lld steps, train loss %.4f, %lld of %lld parameters on rank 0\n", engine->name().c_str(),
                static_cast<long long>(summary.steps), summary.trainLoss,
                static_cast<long long>(engine->parameterCount()),
                static_cast<long long>(engine->modelParameterCount()));
  return engine;
}

}  // namespace

int main(int argc, char** argv) try {
  Run run;
  bool compare = false;
  kolo::parallel::MeshShape mesh{.dp = 1, .pp = 1, .tp = 2};
  std::string text = "/usr/share/common-licenses/GPL-3";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) run.steps = std::atoll(argv[++i]);
    else if (arg == "--batch" && hasValue) run.batch = std::atoll(argv[++i]);
    else if (arg == "--layers" && hasValue) run.config.layers = std::atoll(argv[++i]);
    else if (arg == "--width" && hasValue) run.config.width = std::atoll(argv[++i]);
    else if (arg == "--heads" && hasValue) run.config.heads = std::atoll(argv[++i]);
    else if (arg == "--kv-heads" && hasValue) run.config.kvHeads = std::atoll(argv[++i]);
    else if (arg == "--seq-len" && hasValue) run.config.seqLen = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) run.lr = std::atof(argv[++i]);
    else if (arg == "--text" && hasValue) text = argv[++i];
    else if (arg == "--tp" && hasValue) mesh.tp = std::atoi(argv[++i]);
    else if (arg == "--pp" && hasValue) mesh.pp = std::atoi(argv[++i]);
    else if (arg == "--sequence-parallel") run.sequenceParallel = true;
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  const auto corpus = std::make_shared<const kolo::data::ByteCorpus>(text, run.config.seqLen);
  const auto train = std::make_shared<const kolo::data::ByteWindows>(corpus);

  // The job's ranks (kolo run sets the rank variables): tp × pp model ranks, the rest replicas.
  auto comm = kolo::parallel::init();
  const int modelRanks = mesh.tp * mesh.pp;
  KOLO_REQUIRE(modelRanks >= 1 && comm->size() % modelRanks == 0, "--tp ", mesh.tp, " x --pp ", mesh.pp,
               " does not divide the job's ", comm->size(), " ranks");
  mesh.dp = comm->size() / modelRanks;
  auto split = trainWith(comm->size() > 1 ? comm : nullptr, comm->size() > 1 ? mesh : kolo::parallel::MeshShape{},
                         train, run, true);
  if (!compare) return 0;

  // The same model and batches on one device, in every rank's process; rank 0 compares and
  // tells the others the verdict.
  auto oneDevice = trainWith(nullptr, {}, train, run, false);
  double difference = 0.0;
  if (comm->rank() == 0) difference = kolo::nn::maxRelativeDifference(split->model(), oneDevice->model());
  comm->broadcast(&difference, 1, kolo::DType::F64, 0);
  if (comm->rank() == 0) std::printf("max relative difference %.3g\n", difference);
  return difference <= 1e-5 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "tensor_llama: %s\n", e.what());
  return 1;
}
