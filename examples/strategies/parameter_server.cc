// run: kolo run --ps 1 --workers 2 -- ./parameter_server --steps 600 --compare
// Parameter-server training of a model of your own: a small MLP defined here, trained on
// Fashion-MNIST (or synthetic data when the dataset is not installed) by
// train::trainParameterServer. Every process of the job runs this same program; the library
// reads its role (server, worker or chief) from what `kolo run --ps P --workers W` set. A
// step is one update of the servers, of `batch` samples (the global batch, as under fit):
// one worker's push in async and ssp, a round of every worker's batch / W in sync. With
// --compare the chief then trains the same model on one device for the same steps of the
// same batch and its last line is `accuracy A vs one device B` (test accuracies).
// Options: --steps N (default 600), --mode sync|async|ssp (default async), --batch B, the
// global batch (default 64), --lr LR (default 0.05), --momentum M (default 0.5), --data DIR,
// --compare. Exit status 1 when A is more than 0.05 below B; an error ends it with kolo's
// exit code for it (kolo::main, docs/exit_codes.md).
// Momentum 0.5, not one device's usual 0.9: a stale gradient acts as momentum of its own
// (about 1 - 1/W with W async workers), and 0.9 on top of it trains worse early on
// (docs/parameter_server.md, "Async against PyTorch's RPC parameter server").
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "example_data.h"
#include "kolo/data.h"
#include "kolo/error.h"
#include "kolo/exit_codes.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/threads.h"
#include "kolo/train/engine.h"
#include "kolo/train/fit.h"
#include "kolo/train/parameter_server.h"

namespace {

// 784 -> 256 -> 128 -> 10 with ReLUs.
struct SmallMlp : kolo::nn::Module {
  explicit SmallMlp(kolo::Generator& gen) {
    hidden1 = registerModule("hidden1", std::make_shared<kolo::nn::Linear>(784, 256, gen));
    hidden2 = registerModule("hidden2", std::make_shared<kolo::nn::Linear>(256, 128, gen));
    out = registerModule("out", std::make_shared<kolo::nn::Linear>(128, 10, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, 784)
    return (*out)(kolo::relu((*hidden2)(kolo::relu((*hidden1)(x)))));  // (B, 10)
  }
  std::shared_ptr<kolo::nn::Linear> hidden1, hidden2, out;
};

// Every process builds the same weights: the servers start from them, the workers' first
// pull replaces theirs anyway.
std::shared_ptr<kolo::nn::Module> makeModel() {
  kolo::Generator gen(1);
  return std::make_shared<SmallMlp>(gen);
}

// SGD with `momentum` at `lr`, over whatever parameters it is given (a server's slices, one
// device's model).
kolo::parallel::OptimizerFactory sgd(double lr, double momentum) {
  return [lr, momentum](const kolo::parallel::NamedTensors& parameters) {
    return std::make_unique<kolo::optim::Sgd>(
        parameters, kolo::optim::SgdOptions{.lr = lr, .momentum = momentum});
  };
}

// The same model and optimizer trained on one device for `steps` steps of `batch`.
double oneDeviceAccuracy(std::shared_ptr<kolo::data::TensorDataset> train,
                         std::shared_ptr<kolo::data::TensorDataset> test, int64_t steps,
                         int64_t batch, const kolo::parallel::OptimizerFactory& optimizer) {
  kolo::train::DataParallelOptions single;
  single.strategy.kind = kolo::parallel::StrategyKind::OneDevice;
  kolo::train::DataParallelEngine engine(makeModel, optimizer, single);
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions options;
  options.steps = steps;
  options.batch = batch;
  options.seed = 1;
  options.quiet = true;
  options.logger = &quietLogger;
  return kolo::train::fit(engine, train, test, options).validationAccuracy;
}

}  // namespace

int run(int argc, char** argv) {
  int64_t steps = 600, batch = 64;
  double lr = 0.05, momentum = 0.5;
  bool compare = false;
  std::string mode = "async";
  std::string dataDir = kolo::data::kFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) steps = std::atoll(argv[++i]);
    else if (arg == "--mode" && hasValue) mode = argv[++i];
    else if (arg == "--batch" && hasValue) batch = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) lr = std::atof(argv[++i]);
    else if (arg == "--momentum" && hasValue) momentum = std::atof(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  kolo::setNumThreads(1);  // one intra-op thread per process: the processes fill the cores
  const auto train = loadSplit(dataDir, true);
  const auto test = loadSplit(dataDir, false);

  kolo::train::ParameterServerOptions options;
  options.mode = kolo::parallel::ps::parseMode(mode);
  options.steps = steps;
  options.batch = batch;
  options.seed = 1;
  options.progress = 0;
  const kolo::train::ParameterServerSummary summary =
      kolo::train::trainParameterServer(makeModel, sgd(lr, momentum), train, test, options);
  if (summary.role != kolo::parallel::ps::Role::Chief) return 0;
  std::printf("%s: %lld steps, train loss %.4f, test accuracy %.4f\n", mode.c_str(),
              static_cast<long long>(summary.steps), summary.trainLoss,
              summary.validationAccuracy);
  if (!compare) return 0;

  // One device, the same steps of the same global batch.
  const double reference = oneDeviceAccuracy(train, test, steps, batch, sgd(lr, momentum));
  std::printf("accuracy %.4f vs one device %.4f\n", summary.validationAccuracy, reference);
  return summary.validationAccuracy >= reference - 0.05 ? 0 : 1;
}

int main(int argc, char** argv) { return kolo::main(argc, argv, run); }
