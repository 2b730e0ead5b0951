// run: kolo run -n 2 -- ./fsdp --steps 10 --compare
// Fully sharded data parallelism (ZeRO-3, PyTorch FSDP's FULL_SHARD) for a model of your
// own: a deep residual MLP defined here whose top-level layers are the units each rank holds
// 1/N of (parameters, gradients, SGD's momentum), gathered for forward and backward, trained
// on Fashion-MNIST (or synthetic data when the dataset is not installed) by train::fit over
// a train::DataParallelEngine (one-device when started alone). With --compare it also trains
// the same model on one device in the same job, on the same global batches, and its last
// line is `max relative difference D`: over the weights, the largest
// |sharded - one device| / max|one device| of any tensor.
// Options: --steps N (default 10), --batch B (global, default 128), --lr LR (default 0.05),
// --data DIR, --compare. Exit status 1 when D is above 1e-4 (or on an error).
// Over a few steps the two runs agree to float rounding; over many, a ReLU whose input rounds
// to the other side of zero in one run changes that step's gradient by a finite amount, and
// the runs drift apart as any two float training runs of this recipe do (here from about
// 20-80 steps): --compare is a check of the first steps, whence the default.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "example_data.h"
#include "kolo/data.h"
#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/distributed.h"
#include "kolo/threads.h"
#include "kolo/train/fit.h"

namespace {

// x + W2 relu(W1 norm(x)): a pre-norm residual block of width `width`.
struct ResidualBlock : kolo::nn::Module {
  ResidualBlock(int64_t width, kolo::Generator& gen) {
    norm = registerModule("norm", std::make_shared<kolo::nn::LayerNorm>(kolo::Shape{width}));
    up = registerModule("up", std::make_shared<kolo::nn::Linear>(width, 2 * width, gen));
    down = registerModule("down", std::make_shared<kolo::nn::Linear>(2 * width, width, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, width)
    return kolo::add(x, (*down)(kolo::relu((*up)((*norm)(x)))));
  }
  std::shared_ptr<kolo::nn::LayerNorm> norm;
  std::shared_ptr<kolo::nn::Linear> up, down;
};

// 784 -> 256, four residual blocks, -> 10 classes: six units for fsdp (one per top-level
// layer with parameters).
struct DeepResidualMlp : kolo::nn::Module {
  explicit DeepResidualMlp(kolo::Generator& gen) {
    in = registerModule("in", std::make_shared<kolo::nn::Linear>(784, 256, gen));
    for (int i = 0; i < 4; ++i)
      blocks.push_back(registerModule("block" + std::to_string(i),
                                      std::make_shared<ResidualBlock>(256, gen)));
    out = registerModule("out", std::make_shared<kolo::nn::Linear>(256, 10, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, 784)
    // Children are called as module(x), not module.forward(x): their hooks are where fsdp
    // gathers a unit's parameters before it runs and frees them after.
    kolo::Tensor h = kolo::relu((*in)(x));  // (B, 256)
    for (const auto& block : blocks) h = (*block)(h);
    return (*out)(h);  // (B, 10)
  }
  std::shared_ptr<kolo::nn::Linear> in, out;
  std::vector<std::shared_ptr<ResidualBlock>> blocks;
};

// Trains a fresh DeepResidualMlp on `train` with `strategy` and returns its engine.
std::unique_ptr<kolo::train::DataParallelEngine> trainWith(
    kolo::parallel::StrategyOptions strategy, std::shared_ptr<kolo::data::TensorDataset> train,
    std::shared_ptr<kolo::data::TensorDataset> test, int64_t steps, int64_t batch, double lr,
    bool report) {
  kolo::train::DataParallelOptions distribution;
  distribution.strategy = std::move(strategy);
  auto engine = std::make_unique<kolo::train::DataParallelEngine>(
      [] {
        kolo::Generator gen(1);  // every replica alike (the engine also copies rank 0's)
        return std::make_shared<DeepResidualMlp>(gen);
      },
      [lr](const kolo::parallel::NamedTensors& parameters) {
        return std::make_unique<kolo::optim::Sgd>(
            parameters, kolo::optim::SgdOptions{.lr = lr, .momentum = 0.9, .weightDecay = 1e-4});
      },
      distribution);
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions options;
  options.steps = steps;
  options.batch = batch;
  options.seed = 1;
  options.quiet = !report;
  options.progress = 0;
  if (!report) options.logger = &quietLogger;
  options.schedule = [lr](int64_t totalSteps, int64_t) {
    return std::make_unique<kolo::optim::CosineLr>(lr, totalSteps);
  };
  const kolo::train::FitSummary summary = kolo::train::fit(*engine, train, test, options);
  engine->gatherModel();  // whole weights on every rank until the next step (collective)
  if (report && engine->isPrimary())
    std::printf("%s: %lld steps, train loss %.4f, test accuracy %.4f\n", engine->name().c_str(),
                static_cast<long long>(summary.steps), summary.trainLoss,
                summary.validationAccuracy);
  return engine;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t steps = 10, batch = 128;
  double lr = 0.05;
  bool compare = false;
  std::string dataDir = kolo::data::kFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) steps = std::atoll(argv[++i]);
    else if (arg == "--batch" && hasValue) batch = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) lr = std::atof(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  const auto train = loadSplit(dataDir, true);
  const auto test = loadSplit(dataDir, false);

  // One replica per rank, sharded over the ranks of the job (kolo run sets the rank
  // variables; alone: one device).
  auto comm = kolo::parallel::init();
  kolo::parallel::StrategyOptions strategy;
  strategy.kind = comm->size() > 1 ? kolo::parallel::StrategyKind::FullyShardedDataParallel
                                   : kolo::parallel::StrategyKind::OneDevice;
  strategy.shard = kolo::parallel::ShardLevel::Full;  // parameters sharded too (ZeRO-3)
  strategy.communicator = comm;
  auto distributed = trainWith(strategy, train, test, steps, batch, lr, true);
  if (!compare) return 0;

  // The same model, data order and global batch on one device, in every rank's process.
  kolo::parallel::StrategyOptions single;
  single.kind = kolo::parallel::StrategyKind::OneDevice;
  auto oneDevice = trainWith(single, train, test, steps, batch, lr, false);
  const double difference = kolo::nn::maxRelativeDifference(distributed->model(), oneDevice->model());
  if (comm->rank() == 0) std::printf("max relative difference %.3g\n", difference);
  return difference <= 1e-4 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "fsdp: %s\n", e.what());
  return 1;
}
