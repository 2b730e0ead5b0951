// run: kolo run -n 2 -- ./pipeline --steps 10 --compare
// Pipeline parallelism for a model of your own: a residual MLP defined here as an
// nn::Sequential, cut into one stage per rank where the layers' measured costs balance best,
// and trained by train::fit over a train::ModelParallelEngine with the 1F1B schedule over
// micro-batches, on Fashion-MNIST (or synthetic data when the dataset is not installed).
// Every stage loads the whole global batch; the first reads its inputs, the last its labels.
// With --compare it also trains the same model in one process in the same job, on the same
// global batches, and its last line is `max relative difference D`: over the weights (the
// stages' gathered on rank 0), the largest |pipeline - one process| / max|one process| of
// any tensor. Options: --steps N (default 10), --batch B (global, default 128),
// --micro-batches M (default 4), --lr LR (default 0.05), --data DIR, --compare. Exit status
// 1 when D is above 1e-4 (or on an error).
// Over a few steps the two runs agree to float rounding; over many, a ReLU whose input rounds
// to the other side of zero in one run changes that step's gradient by a finite amount, and
// the runs drift apart as any two float training runs of this recipe do (here from about
// 20-80 steps): --compare is a check of the first steps, whence the default.
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

// 784 -> 128, four residual blocks, -> 10 classes: a Sequential, so that the pipeline can
// cut it between any two layers.
std::shared_ptr<kolo::nn::Sequential> makeModel() {
  kolo::Generator gen(1);  // every rank builds the same weights and keeps its stage
  auto model = std::make_shared<kolo::nn::Sequential>();
  model->add(std::make_shared<kolo::nn::Linear>(784, 128, gen));
  model->add(std::make_shared<kolo::nn::ReLU>());
  for (int b = 0; b < 4; ++b) model->add(std::make_shared<ResidualBlock>(128, gen));
  model->add(std::make_shared<kolo::nn::Linear>(128, 10, gen));
  return model;
}

struct Settings {
  int64_t steps = 10, batch = 128;
  int microBatches = 4;
  double lr = 0.05;
};

// Trains a fresh model over `comm`'s ranks, one stage each (null: one process holding every
// layer, the whole batch in one pass), and returns its engine.
std::unique_ptr<kolo::train::ModelParallelEngine> trainWith(
    std::shared_ptr<kolo::comm::Communicator> comm, std::shared_ptr<kolo::data::TensorDataset> train,
    std::shared_ptr<kolo::data::TensorDataset> test, const Settings& settings, bool report) {
  kolo::train::ModelParallelOptions parallelism;
  parallelism.communicator = comm;
  parallelism.mesh.pp = comm ? comm->size() : 1;
  // One process takes the whole batch at once: the pipeline's micro-batches must add up to it.
  parallelism.microBatches = comm ? settings.microBatches : 1;
  parallelism.schedule = kolo::parallel::PipelineSchedule::OneFOneB;
  // The split is measured on one micro-batch of inputs (rank 0 times each layer).
  std::vector<int64_t> rows(static_cast<size_t>(settings.batch / settings.microBatches));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  parallelism.splitSample = train->gather(rows).inputs;
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
  if (report && engine->isPrimary()) {
    const std::vector<int>& bounds = engine->bounds();
    std::printf("%s: %zu stages, layers", engine->name().c_str(), bounds.size() - 1);
    for (size_t s = 0; s + 1 < bounds.size(); ++s) std::printf(" %d-%d", bounds[s], bounds[s + 1] - 1);
    std::printf(", %lld steps, train loss %.4f, test accuracy %.4f\n",
                static_cast<long long>(summary.steps), summary.trainLoss, summary.validationAccuracy);
  }
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
    else if (arg == "--micro-batches" && hasValue) settings.microBatches = std::atoi(argv[++i]);
    else if (arg == "--lr" && hasValue) settings.lr = std::atof(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  KOLO_REQUIRE(settings.microBatches >= 1 && settings.batch % settings.microBatches == 0, "--batch ",
               settings.batch, " does not split into ", settings.microBatches, " micro-batches");
  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  const auto train = loadSplit(dataDir, true);
  const auto test = loadSplit(dataDir, false);

  // One stage per rank of the job (kolo run sets the rank variables; alone: one stage).
  auto comm = kolo::parallel::init();
  auto pipelined = trainWith(comm->size() > 1 ? comm : nullptr, train, test, settings, true);
  if (!compare) return 0;

  // The same model, data order and global batch in one process, on every rank; rank 0
  // compares and tells the others the verdict.
  auto oneProcess = trainWith(nullptr, train, test, settings, false);
  double difference = 0.0;
  if (comm->rank() == 0) difference = kolo::nn::maxRelativeDifference(pipelined->model(), oneProcess->model());
  comm->broadcast(&difference, 1, kolo::DType::F64, 0);
  if (comm->rank() == 0) std::printf("max relative difference %.3g\n", difference);
  return difference <= 1e-4 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "pipeline: %s\n", e.what());
  return 1;
}
