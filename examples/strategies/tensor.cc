// run: kolo run -n 2 -- ./tensor --steps 10 --compare
// Tensor parallelism for a model of your own: an MLP defined here as an nn::Sequential whose
// Linear pairs (Linear, activation, Linear) are split Megatron-style over the ranks (the
// first column-parallel, the second row-parallel; the rest replicated), trained by
// train::fit over a train::ModelParallelEngine on Fashion-MNIST (or synthetic data when the
// dataset is not installed). With --dp D the job is a mesh of D data-parallel replicas of
// tensor groups of N/D ranks (kolo run -n 4 -- ./tensor --dp 2). With --compare it also
// trains the same model in one process in the same job, on the same global batches, and its
// last line is `max relative difference D`: over the weights (the shards gathered on rank
// 0), the largest |split - one process| / max|one process| of any tensor. Options: --steps
// N (default 100), --batch B (global, default 128), --dp D (default 1), --lr LR (default
// 0.05), --data DIR, --compare. Exit status 1 when D is above 1e-4 (or on an error).
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
#include "kolo/parallel/distributed.h"
#include "kolo/threads.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"

namespace {

// 784 -> 256 -> 128 (split: column- then row-parallel), a LayerNorm (replicated), 128 -> 256
// -> 128 (split), then 128 -> 10 (replicated): a Sequential, so that the engine can split its
// layers.
std::shared_ptr<kolo::nn::Sequential> makeModel() {
  kolo::Generator gen(1);  // every rank builds the same weights and keeps its shards
  auto model = std::make_shared<kolo::nn::Sequential>();
  model->add(std::make_shared<kolo::nn::Linear>(784, 256, gen));
  model->add(std::make_shared<kolo::nn::ReLU>());
  model->add(std::make_shared<kolo::nn::Linear>(256, 128, gen));
  model->add(std::make_shared<kolo::nn::LayerNorm>(kolo::Shape{128}));
  model->add(std::make_shared<kolo::nn::Linear>(128, 256, gen));
  model->add(std::make_shared<kolo::nn::GELU>());
  model->add(std::make_shared<kolo::nn::Linear>(256, 128, gen));
  model->add(std::make_shared<kolo::nn::ReLU>());
  model->add(std::make_shared<kolo::nn::Linear>(128, 10, gen));
  return model;
}

struct Settings {
  int64_t steps = 100, batch = 128;
  int dp = 1;
  double lr = 0.05;
};

// Trains a fresh model over `comm`'s ranks, settings.dp replicas of tensor groups (null: one
// process holding every weight), and returns its engine.
std::unique_ptr<kolo::train::ModelParallelEngine> trainWith(
    std::shared_ptr<kolo::comm::Communicator> comm, std::shared_ptr<kolo::data::TensorDataset> train,
    std::shared_ptr<kolo::data::TensorDataset> test, const Settings& settings, bool report) {
  kolo::train::ModelParallelOptions parallelism;
  parallelism.communicator = comm;
  if (comm) parallelism.mesh = {.dp = settings.dp, .pp = 1, .tp = comm->size() / settings.dp};
  const double lr = settings.lr;
  auto engine = std::make_unique<kolo::train::ModelParallelEngine>(
      makeModel,
      [lr](const kolo::parallel::NamedTensors& parameters) {
        return std::make_unique<kolo::optim::Sgd>(parameters,
                                                  kolo::optim::SgdOptions{.lr = lr, .momentum = 0.9});
      },
      parallelism);
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions options;
  options.steps = settings.steps;
  options.batch = settings.batch;
  options.seed = 1;
  options.quiet = !report;
  options.progress = 0;
  if (!report) options.logger = &quietLogger;
  options.schedule = [lr](int64_t totalSteps, int64_t) {
    return std::make_unique<kolo::optim::CosineLr>(lr, totalSteps);
  };
  const kolo::train::FitSummary summary = kolo::train::fit(*engine, train, test, options);
  engine->gatherModel();  // the whole model on rank 0 (collective)
  if (report && engine->isPrimary())
    std::printf("%s: %d replica(s) of %d tensor rank(s), %lld steps, train loss %.4f, test accuracy %.4f\n",
                engine->name().c_str(), engine->replicas(), engine->mesh().tp,
                static_cast<long long>(summary.steps), summary.trainLoss, summary.validationAccuracy);
  return engine;
}

}  // namespace

int main(int argc, char** argv) try {
  Settings settings;
  bool compare = false;
  std::string dataDir = kolo::data::kFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) settings.steps = std::atoll(argv[++i]);
    else if (arg == "--batch" && hasValue) settings.batch = std::atoll(argv[++i]);
    else if (arg == "--dp" && hasValue) settings.dp = std::atoi(argv[++i]);
    else if (arg == "--lr" && hasValue) settings.lr = std::atof(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  const auto train = loadSplit(dataDir, true);
  const auto test = loadSplit(dataDir, false);

  // The job's ranks (kolo run sets the rank variables; alone: one process).
  auto comm = kolo::parallel::init();
  KOLO_REQUIRE(settings.dp >= 1 && comm->size() % settings.dp == 0, "--dp ", settings.dp,
               " does not divide the job's ", comm->size(), " ranks");
  auto split = trainWith(comm->size() > 1 ? comm : nullptr, train, test, settings, true);
  if (!compare) return 0;

  // The same model, data order and global batch in one process, on every rank; rank 0
  // compares and tells the others the verdict.
  auto oneProcess = trainWith(nullptr, train, test, settings, false);
  double difference = 0.0;
  if (comm->rank() == 0) difference = kolo::nn::maxRelativeDifference(split->model(), oneProcess->model());
  comm->broadcast(&difference, 1, kolo::DType::F64, 0);
  if (comm->rank() == 0) std::printf("max relative difference %.3g\n", difference);
  return difference <= 1e-4 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "tensor: %s\n", e.what());
  return 1;
}
