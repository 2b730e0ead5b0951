// run: kolo run -n 2 -- ./conv_net --steps 10 --compare
// A residual convolutional network of your own with batch norm, trained data-parallel with
// synchronised batch norm: a stem convolution, two residual blocks (the second halving the
// image with a strided convolution and a 1x1 shortcut), each convolution followed by a
// BatchNorm2d, then average pooling and a linear head; on Fashion-MNIST (or synthetic data
// when the dataset is not installed) by train::fit over a train::DataParallelEngine, one
// replica per rank (multi-worker-mirrored; one-device when started alone). Every rank's batch
// norms normalise with the global batch's statistics (StrategyOptions::syncBatchNorm, which
// calls parallel::convertSyncBatchNorm on the replica), so the ranks train as one device on
// the global batch. With --compare it also trains the same model on one device in the same
// job, on the same global batches, and its last line is `max relative difference D`: over the
// weights and running statistics, the largest |distributed - one device| / max|one device|
// of any tensor. Options: --steps N (default 10), --batch B (global, default 128), --lr LR
// (default 0.02), --data DIR, --compare, --no-sync (each rank normalises with its own share:
// the difference then shows). Exit status 1 when D is above 1e-4 (or on an error).
//
// Why 0.02: at 0.05 with momentum 0.9 the first dozen steps of this small network are chaotic,
// and rounding alone grows a thousandfold within a step or two. The distributed run sums two
// half-batches where one device sums one batch, so the two differ in the last bits from the
// first step; at 0.05 that becomes 4e-4 after 10 steps at -O1 and 4e-4 after 12 steps at -O3
// (8e-3 after 20). PyTorch's own f32 run of this network differs from its f64 run by 1e-4
// after 12 steps at 0.05 and by 1e-6 at 0.02. At 0.02 the difference stays near 3e-7.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

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

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); a strided block's shortcut is a 1x1
// convolution with its own batch norm.
struct ResidualBlock : kolo::nn::Module {
  ResidualBlock(int64_t in, int64_t out, int64_t stride, kolo::Generator& gen) {
    conv1 = registerModule("conv1", std::make_shared<kolo::nn::Conv2d>(in, out, 3, gen, stride, 1, false));
    bn1 = registerModule("bn1", std::make_shared<kolo::nn::BatchNorm2d>(out));
    conv2 = registerModule("conv2", std::make_shared<kolo::nn::Conv2d>(out, out, 3, gen, 1, 1, false));
    bn2 = registerModule("bn2", std::make_shared<kolo::nn::BatchNorm2d>(out));
    shortcut = registerModule("shortcut", std::make_shared<kolo::nn::Sequential>());
    if (stride != 1 || in != out) {
      shortcut->add(std::make_shared<kolo::nn::Conv2d>(in, out, 1, gen, stride, 0, false));
      shortcut->add(std::make_shared<kolo::nn::BatchNorm2d>(out));
    }
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, in, H, W)
    const kolo::Tensor y = kolo::relu((*bn1)((*conv1)(x)));
    return kolo::relu(kolo::add((*bn2)((*conv2)(y)), (*shortcut)(x)));  // (B, out, H/s, W/s)
  }
  std::shared_ptr<kolo::nn::Conv2d> conv1, conv2;
  std::shared_ptr<kolo::nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<kolo::nn::Sequential> shortcut;
};

// (B, 784) -> (B, 1, 28, 28) -> stem 8 channels at 14x14 -> block 8 -> block 16 at 7x7 ->
// average -> 10 classes.
struct ConvNet : kolo::nn::Module {
  explicit ConvNet(kolo::Generator& gen) {
    stem = registerModule("stem", std::make_shared<kolo::nn::Conv2d>(1, 8, 3, gen, 2, 1, false));
    bn = registerModule("bn", std::make_shared<kolo::nn::BatchNorm2d>(8));
    block1 = registerModule("block1", std::make_shared<ResidualBlock>(8, 8, 1, gen));
    block2 = registerModule("block2", std::make_shared<ResidualBlock>(8, 16, 2, gen));
    head = registerModule("head", std::make_shared<kolo::nn::Linear>(16, 10, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {
    // Children called as module(x), so that their hooks run (anomaly checks, fsdp's gathers).
    const kolo::Tensor image = x.reshape({x.size(0), 1, 28, 28});
    const kolo::Tensor features = (*block2)((*block1)(kolo::relu((*bn)((*stem)(image)))));  // (B, 16, 7, 7)
    return (*head)(kolo::adaptiveAvgPool2d(features, 1, 1).flatten(1));                       // (B, 10)
  }
  std::shared_ptr<kolo::nn::Conv2d> stem;
  std::shared_ptr<kolo::nn::BatchNorm2d> bn;
  std::shared_ptr<ResidualBlock> block1, block2;
  std::shared_ptr<kolo::nn::Linear> head;
};

// Trains a fresh ConvNet on `train` with `strategy` and returns its engine.
std::unique_ptr<kolo::train::DataParallelEngine> trainWith(
    kolo::parallel::StrategyOptions strategy, std::shared_ptr<kolo::data::TensorDataset> train,
    std::shared_ptr<kolo::data::TensorDataset> test, int64_t steps, int64_t batch, double lr,
    bool report) {
  kolo::train::DataParallelOptions distribution;
  distribution.strategy = std::move(strategy);
  auto engine = std::make_unique<kolo::train::DataParallelEngine>(
      [] {
        kolo::Generator gen(1);  // every replica alike (the engine also copies rank 0's)
        return std::make_shared<ConvNet>(gen);
      },
      [lr](const kolo::parallel::NamedTensors& parameters) {
        return std::make_unique<kolo::optim::Sgd>(
            parameters, kolo::optim::SgdOptions{.lr = lr, .momentum = 0.9});
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
  if (report && engine->isPrimary())
    std::printf("%s: %lld steps, train loss %.4f, test accuracy %.4f\n", engine->name().c_str(),
                static_cast<long long>(summary.steps), summary.trainLoss,
                summary.validationAccuracy);
  return engine;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t steps = 10, batch = 128;
  double lr = 0.02;
  bool compare = false, sync = true;
  std::string dataDir = kolo::data::kFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) steps = std::atoll(argv[++i]);
    else if (arg == "--batch" && hasValue) batch = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) lr = std::atof(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else if (arg == "--no-sync") sync = false;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  const auto train = loadSplit(dataDir, true);
  const auto test = loadSplit(dataDir, false);

  // One replica per rank of the job (kolo run sets the rank variables; alone: one rank).
  auto comm = kolo::parallel::init();
  kolo::parallel::StrategyOptions strategy;
  strategy.kind = comm->size() > 1 ? kolo::parallel::StrategyKind::MultiWorkerMirrored
                                   : kolo::parallel::StrategyKind::OneDevice;
  strategy.communicator = comm;
  strategy.syncBatchNorm = sync;  // [distributed] the global batch's statistics in every batch norm
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
  std::fprintf(stderr, "conv_net: %s\n", e.what());
  return 1;
}
