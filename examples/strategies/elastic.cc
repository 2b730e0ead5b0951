// run: kolo run --elastic -n 2 -- ./elastic --steps 10 --compare
// Elastic data parallelism for a model of your own: a gated MLP defined here, trained on
// Fashion-MNIST (or synthetic data when the dataset is not installed) by train::fit over a
// train::ElasticEngine. Under `kolo run --elastic` the job survives the loss of ranks: to
// show it, the last launch rank SIGKILLs itself before step --kill-at (default: half the
// steps; -1 keeps every rank), the survivors regroup, go back to the state after the last
// step every member completed and carry on; the rank kolo run starts in its place joins at
// a step boundary (or finds the job finished). Every global batch is still the same samples
// in the same order, so with --compare, which also trains the same model on one device in
// the same job on the same global batches, the last line `max relative difference D` (over
// the weights, the largest |elastic - one device| / max|one device| of any tensor) measures
// only float rounding, killed rank or not. Options: --steps N (default 100), --batch B
// (global, default 64: every world size from 1 to -n must divide it), --lr LR (default
// 0.05), --kill-at STEP, --data DIR, --compare. Exit status 1 when D is above 1e-4 (or on an
// error).
#include <signal.h>

#include <algorithm>
#include <cmath>
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
#include "kolo/parallel/elastic.h"
#include "kolo/threads.h"
#include "kolo/train/elastic.h"
#include "kolo/train/fit.h"

namespace {

// 784 -> 96 (GELU, LayerNorm), a gated unit value(h) * tanh(gate(h)), -> 10 classes.
struct GatedMlp : kolo::nn::Module {
  explicit GatedMlp(kolo::Generator& gen) {
    in = registerModule("in", std::make_shared<kolo::nn::Linear>(784, 96, gen));
    norm = registerModule("norm", std::make_shared<kolo::nn::LayerNorm>(kolo::Shape{96}));
    value = registerModule("value", std::make_shared<kolo::nn::Linear>(96, 96, gen));
    gate = registerModule("gate", std::make_shared<kolo::nn::Linear>(96, 96, gen));
    out = registerModule("out", std::make_shared<kolo::nn::Linear>(96, 10, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, 784)
    const kolo::Tensor h = (*norm)(kolo::gelu((*in)(x)));  // (B, 96)
    return (*out)(kolo::mul((*value)(h), kolo::tanh((*gate)(h))));  // (B, 10)
  }
  std::shared_ptr<kolo::nn::Linear> in, value, gate, out;
  std::shared_ptr<kolo::nn::LayerNorm> norm;
};

std::shared_ptr<kolo::nn::Module> makeModel() {
  kolo::Generator gen(1);  // every rank alike (the engine also copies rank 0's)
  return std::make_shared<GatedMlp>(gen);
}

// The same options for the elastic run and the one-device reference.
kolo::train::FitOptions fitOptions(int64_t steps, int64_t batch, double lr) {
  kolo::train::FitOptions options;
  options.steps = steps;
  options.batch = batch;
  options.seed = 1;
  options.progress = 0;
  options.prefetch = 0;
  options.schedule = [lr](int64_t totalSteps, int64_t) {
    return std::make_unique<kolo::optim::CosineLr>(lr, totalSteps);
  };
  return options;
}

std::unique_ptr<kolo::optim::Optimizer> makeOptimizer(const kolo::parallel::NamedTensors& parameters,
                                                      double lr) {
  return std::make_unique<kolo::optim::Sgd>(parameters, kolo::optim::SgdOptions{.lr = lr, .momentum = 0.9});
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t steps = 100, batch = 64, killAt = -2;  // -2: half the steps
  double lr = 0.05;
  bool compare = false;
  std::string dataDir = kolo::data::kFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) steps = std::atoll(argv[++i]);
    else if (arg == "--batch" && hasValue) batch = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) lr = std::atof(argv[++i]);
    else if (arg == "--kill-at" && hasValue) killAt = std::atoll(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  if (killAt == -2) killAt = steps / 2;
  KOLO_REQUIRE(kolo::parallel::ElasticContext::launchedElastic(),
               "start it under kolo run --elastic (e.g. kolo run --elastic -n 2 -- ./elastic)");
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  const auto train = loadSplit(dataDir, true, 8000, 2000);
  const auto test = loadSplit(dataDir, false, 8000, 2000);

  // [elastic] This rank's membership: a rank kolo run started in a lost one's place blocks
  // here until a generation admits it, or gets null when the job finished first.
  kolo::parallel::ElasticOptions membership;  // the bounds and deadline come from kolo run
  std::shared_ptr<kolo::parallel::ElasticContext> context =
      kolo::parallel::ElasticContext::fromEnvironment(std::move(membership));
  if (!context) {
    std::printf("the job finished before this rank was admitted\n");
    return 0;
  }
  // [elastic] The engine: each generation's data parallelism over its members.
  kolo::train::ElasticEngineOptions elastic;
  elastic.dataParallel.strategy.kind = kolo::parallel::StrategyKind::MultiWorkerMirrored;
  kolo::train::ElasticEngine engine(
      context, makeModel,
      [lr](const kolo::parallel::NamedTensors& parameters) { return makeOptimizer(parameters, lr); }, elastic);
  // The rank that dies on purpose: the last one launched (not a replacement).
  const bool dies = killAt >= 0 && !engine.joinedAt() && context->size() > 1 &&
                    context->id() == context->size() - 1;
  kolo::train::FitCallbacks callbacks;
  callbacks.onStepBegin = [&](int64_t step) {
    if (!dies || step != killAt) return;
    std::printf("rank %d: killing itself before step %lld\n", context->id(), static_cast<long long>(step));
    std::fflush(nullptr);
    ::raise(SIGKILL);
  };
  const kolo::train::FitSummary summary = kolo::train::fit(engine, train, test, fitOptions(steps, batch, lr), callbacks);
  if (engine.isPrimary())
    std::printf("elastic: %lld steps, %d rank(s) at the end (generation %lld), test accuracy %.4f\n",
                static_cast<long long>(summary.steps), context->size(),
                static_cast<long long>(context->generation()), summary.validationAccuracy);
  if (!compare) return 0;

  // The same model, data order and global batches on one device, in every rank's process.
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions alone = fitOptions(steps, batch, lr);
  alone.quiet = true;
  alone.logger = &quietLogger;
  kolo::train::DataParallelEngine oneDevice(
      makeModel, [lr](const kolo::parallel::NamedTensors& parameters) { return makeOptimizer(parameters, lr); },
      {});
  kolo::train::fit(oneDevice, train, nullptr, alone);
  const double difference = kolo::nn::maxRelativeDifference(engine.model(), oneDevice.model());
  if (engine.isPrimary()) std::printf("max relative difference %.3g\n", difference);
  return difference <= 1e-4 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "elastic: %s\n", e.what());
  return 1;
}
