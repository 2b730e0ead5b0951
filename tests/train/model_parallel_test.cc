// ModelParallelEngine in-process, ranks as threads: fit over a 2-stage pipeline (measured
// split, 1F1B, micro-batches), 2 tensor ranks, and a dp=2 × pp=2 mesh takes the steps of the
// unsplit model on one process (with a check that training moved the weights); a checkpoint
// written by one layout resumes in another (and in a DataParallelEngine) to the weights of a
// straight run, and a checkpoint of another model is refused on every rank; evaluate() over
// the stages and tensor ranks (a language model's logits split by vocabulary too) gives the
// figures of one process, and gatherModel() rank 0 the whole weights; bad options are named.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kolo/byte_corpus.h"
#include "kolo/error.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"
#include "kolo/train/report.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

namespace fs = std::filesystem;
using parallel::testing::nativeRanks;
using parallel::testing::runThreads;
using testing::maxAbsDiff;
using testing::sgd;
using testing::weights;

constexpr int64_t kFeatures = 12;
constexpr int64_t kClasses = 4;

std::shared_ptr<data::TensorDataset> dataset(int64_t n, uint64_t seed) {
  return testing::linearDataset(n, seed, kFeatures, kClasses);
}

// Linear-ReLU-Linear (split column- then row-parallel under tp), then LayerNorm, ReLU and a
// replicated Linear: five layers to cut into stages.
std::shared_ptr<nn::Sequential> model() {
  Generator gen(3);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kFeatures, 16, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 16, gen), std::make_shared<nn::LayerNorm>(Shape{16}),
      std::make_shared<nn::Linear>(16, kClasses, gen)});
}

std::string freshDir(const std::string& name) { return testing::freshDir("kolo_model_parallel_test", name); }

// A layout: the mesh and the pipeline's settings (sample: measure the split).
struct Layout {
  parallel::MeshShape mesh{};
  int microBatches = 1;
  std::vector<int> splitAt{};
  bool measure = false;
};

struct RunResult {
  std::vector<float> weights;  // rank 0's, whole
  FitSummary summary;
  std::vector<double> losses;  // rank 0's, per step
  RankReport report;           // rank 0's
};

// Trains `steps` steps in `layout` (mesh size 1: one process, no communicator) and returns
// rank 0's whole weights; `change` edits fit's options first.
RunResult trainIn(const Layout& layout, int64_t steps, const std::function<void(FitOptions&)>& change = nullptr,
            const FitCallbacks& callbacks = {}) {
  const auto train = dataset(256, 1);
  const auto test = dataset(64, 2);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  RunResult result;
  auto run = [&](std::shared_ptr<comm::Communicator> comm) {
    ModelParallelOptions options;
    options.communicator = comm;
    options.mesh = layout.mesh;
    options.microBatches = layout.microBatches;
    options.splitAt = layout.splitAt;
    if (layout.measure) options.splitSample = train->gather({0, 1, 2, 3}).inputs;
    ModelParallelEngine engine(model, sgd, options);
    FitOptions fitOptions = testing::quietFit(16, steps, logger);
    if (change) change(fitOptions);
    FitCallbacks mine = callbacks;
    std::vector<double> losses;
    mine.onStepEnd = [&](const StepEnd& end) { losses.push_back(end.loss); };
    const FitSummary summary = fit(engine, train, test, fitOptions, mine);
    engine.gatherModel();
    if (engine.isPrimary()) {
      result.weights = weights(engine.model());
      result.summary = summary;
      result.losses = losses;
      result.report = rankReport(engine, summary);
    }
  };
  if (layout.mesh.size() == 1) {
    run(nullptr);
  } else {
    auto make = nativeRanks(layout.mesh.size());
    runThreads(layout.mesh.size(), [&](int rank) { run(make(rank)); });
  }
  return result;
}

const Layout kOneProcess{};
const Layout kPipeline{.mesh = {.dp = 1, .pp = 2, .tp = 1}, .microBatches = 4, .measure = true};
const Layout kTensor{.mesh = {.dp = 1, .pp = 1, .tp = 2}};
const Layout kMesh{.mesh = {.dp = 2, .pp = 2, .tp = 1}, .microBatches = 2, .splitAt = {3}};

TEST(ModelParallelEngineTest, EveryLayoutTakesTheStepsOfOneProcess) {
  const std::vector<float> initial = weights(*model());
  const RunResult one = trainIn(kOneProcess, 12);
  EXPECT_GT(maxAbsDiff(one.weights, initial), 1e-2) << "training did not move the weights";
  for (const auto& [name, layout] : {std::pair{"pipeline", kPipeline}, std::pair{"tensor", kTensor},
                                     std::pair{"mesh dp=2,pp=2", kMesh}}) {
    const RunResult split = trainIn(layout, 12);
    EXPECT_LT(maxAbsDiff(one.weights, split.weights), 2e-5) << name;
    ASSERT_EQ(split.losses.size(), one.losses.size()) << name;
    for (size_t s = 0; s < one.losses.size(); ++s)
      EXPECT_NEAR(split.losses[s], one.losses[s], 1e-5) << name << " step " << s;
    // The whole model on rank 0 evaluates as one process does.
    EXPECT_NEAR(split.summary.validationAccuracy, one.summary.validationAccuracy, 1e-9) << name;
    EXPECT_NEAR(split.summary.validationLoss, one.summary.validationLoss, 1e-5) << name;
    // Every rank's figures; a pipeline's stages held micro-batches and boundary activations.
    ASSERT_EQ(split.summary.ranks.size(), static_cast<size_t>(layout.mesh.size())) << name;
    for (const RankFigures& f : split.summary.ranks) {
      EXPECT_GT(f.peakTensorBytes, 0) << name << " rank " << f.rank;
      if (layout.mesh.pp == 1) continue;
      EXPECT_GE(f.peakMicroBatchesHeld, 1) << name << " rank " << f.rank;
      EXPECT_LE(f.peakMicroBatchesHeld, layout.microBatches) << name << " rank " << f.rank;
      EXPECT_GT(f.peakBoundaryBytes, 0) << name << " rank " << f.rank;
    }
  }
}

TEST(ModelParallelEngineTest, TheRankReportNamesEachRanksLayersAndTheLayoutsStep) {
  auto starts = [](const std::string& line, const std::string& prefix) { return line.rfind(prefix, 0) == 0; };
  const RankReport pipeline = trainIn(kPipeline, 4).report;
  ASSERT_EQ(pipeline.ranks.size(), 2u);
  EXPECT_TRUE(starts(pipeline.ranks[0], "stage 0: layers 0-")) << pipeline.ranks[0];
  EXPECT_TRUE(starts(pipeline.ranks[1], "stage 1: layers ")) << pipeline.ranks[1];
  EXPECT_NE(pipeline.ranks[1].find("-" + std::to_string(model()->size() - 1) + "  compute "), std::string::npos)
      << pipeline.ranks[1];
  EXPECT_TRUE(starts(pipeline.layout, "pipeline stages 2 micro_batches 4 schedule 1f1b step_ms ")) << pipeline.layout;
  EXPECT_NE(pipeline.layout.find(" measured_over_ideal "), std::string::npos) << pipeline.layout;

  const RankReport tensor = trainIn(kTensor, 2).report;
  ASSERT_EQ(tensor.ranks.size(), 2u);
  EXPECT_TRUE(starts(tensor.ranks[1], "rank 1: layers 0-")) << tensor.ranks[1];
  EXPECT_TRUE(starts(tensor.layout, "tensor_parallel ranks 2 step_ms ")) << tensor.layout;

  // Replica 0's model group: stage 0 and stage 1 of the first replica.
  const RankReport mesh = trainIn(kMesh, 2).report;
  ASSERT_EQ(mesh.ranks.size(), 2u);
  EXPECT_TRUE(starts(mesh.ranks[0], "stage 0: layers 0-2  ")) << mesh.ranks[0];
  EXPECT_TRUE(starts(mesh.layout, "pipeline stages 2 micro_batches 2 schedule 1f1b ")) << mesh.layout;
}

TEST(ModelParallelEngineTest, EvaluationWhereTheModelLivesGivesOneProcesssFigures) {
  // A small lm: 7 layers to cut into stages; under tp its logits are split by vocabulary.
  const nn::LanguageModelConfig sizes{.vocab = 256, .layers = 2, .dModel = 16, .heads = 2, .seqLen = 8};
  auto lm = [&sizes] {
    Generator gen(11);
    return nn::makeLanguageModel(sizes, gen);
  };
  std::vector<uint8_t> text;
  for (int i = 0; i < 700; ++i) text.push_back(static_cast<uint8_t>("the quick brown fox "[i % 20] + (i % 7 == 0)));
  const auto corpus = std::make_shared<data::ByteCorpus>(text, 8, 0.1, "test text");
  const data::ByteWindows windows(corpus);  // 78 windows
  const EvaluateOptions byLm{.batch = 10, .loss = nn::languageModelLoss, .communicator = nullptr};
  const EvaluateResult one = evaluate(*lm(), windows, byLm);
  EXPECT_GT(one.accuracy, 0.0);
  for (const parallel::MeshShape mesh : {parallel::MeshShape{.dp = 1, .pp = 2, .tp = 2},
                                        parallel::MeshShape{.dp = 2, .pp = 1, .tp = 2},
                                        parallel::MeshShape{.dp = 2, .pp = 2, .tp = 1}}) {
    auto make = nativeRanks(mesh.size());
    std::vector<EvaluateResult> results(static_cast<size_t>(mesh.size()));
    runThreads(mesh.size(), [&](int rank) {
      ModelParallelOptions options;
      options.communicator = make(rank);
      options.mesh = mesh;
      options.splitAt = mesh.pp > 1 ? std::vector<int>{3} : std::vector<int>{};
      if (mesh.tp == 1) options.loss = nn::languageModelLoss;
      ModelParallelEngine engine(lm, sgd, options);
      results[static_cast<size_t>(rank)] = engine.evaluate(windows, byLm);
    });
    const std::string name = "dp=" + std::to_string(mesh.dp) + ",pp=" + std::to_string(mesh.pp) +
                             ",tp=" + std::to_string(mesh.tp);
    for (const EvaluateResult& r : results) {
      EXPECT_EQ(r.samples, one.samples) << name;
      EXPECT_NEAR(r.loss, one.loss, 1e-5 * one.loss) << name;
      EXPECT_DOUBLE_EQ(r.accuracy, one.accuracy) << name;
    }
  }
}

// Stopped after its checkpoint of step 4, a run continues in another layout to the weights
// of a straight 8-step run: the checkpoint holds the whole model and its momentum.
TEST(ModelParallelEngineTest, CheckpointsResumeInAnyLayout) {
  const RunResult straight = trainIn(kOneProcess, 8);
  FitCallbacks crash;
  crash.onStepBegin = [](int64_t step) {
    if (step == 5) KOLO_THROW(Error, "stopped at step 5");
  };
  const std::vector<std::pair<Layout, Layout>> cases = {
      {kPipeline, kTensor}, {kTensor, kMesh}, {kMesh, kOneProcess}};
  int index = 0;
  for (const auto& [writer, reader] : cases) {
    const std::string dir = freshDir("resume" + std::to_string(index++));
    EXPECT_THROW(trainIn(writer, 8, [&](FitOptions& o) {
      o.checkpointDir = dir;
      o.checkpointEvery = 4;
    }, crash), Error);
    ASSERT_TRUE(fs::exists(fs::path(dir) / "ckpt-000000004")) << index;
    const RunResult resumed = trainIn(reader, 8, [&](FitOptions& o) { o.resumeDir = dir; });
    EXPECT_LT(maxAbsDiff(straight.weights, resumed.weights), 2e-5) << "case " << index;
    fs::remove_all(dir);
  }
}

// The checkpoint format is the data-parallel engine's: a pipeline's checkpoint resumes on one
// device under a DataParallelEngine.
TEST(ModelParallelEngineTest, ADataParallelEngineResumesAPipelinesCheckpoint) {
  const std::string dir = freshDir("to_data_parallel");
  const RunResult straight = trainIn(kOneProcess, 8);
  trainIn(kPipeline, 4, [&](FitOptions& o) { o.checkpointDir = dir; });
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  DataParallelEngine engine([] { return model(); }, sgd, {});
  FitOptions options;
  options.batch = 16;
  options.seed = 5;
  options.quiet = true;
  options.logger = &logger;
  options.prefetch = 0;
  options.steps = 8;
  options.resumeDir = dir;
  fit(engine, dataset(256, 1), nullptr, options);
  EXPECT_LT(maxAbsDiff(straight.weights, weights(engine.model())), 2e-5);
  fs::remove_all(dir);
}

// A checkpoint of another model (a wider first layer) is refused with Mismatch naming the
// tensor, on every rank, rather than loaded in part or left waiting.
TEST(ModelParallelEngineTest, ACheckpointOfAnotherModelIsRefusedOnEveryRank) {
  const std::string dir = freshDir("other_model");
  trainIn(kPipeline, 2, [&](FitOptions& o) { o.checkpointDir = dir; });
  auto wider = [] {
    Generator gen(3);
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(kFeatures, 32, gen), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(32, 16, gen), std::make_shared<nn::LayerNorm>(Shape{16}),
        std::make_shared<nn::Linear>(16, kClasses, gen)});
  };
  auto make = nativeRanks(2);
  std::vector<std::string> messages(2);
  runThreads(2, [&](int rank) {
    const ModelParallelOptions options{.communicator = make(rank), .mesh = {.dp = 1, .pp = 1, .tp = 2}};
    ModelParallelEngine engine(wider, sgd, options);
    try {
      load({&engine}, {.directory = dir, .communicator = options.communicator});
      ADD_FAILURE() << "rank " << rank << " loaded another model's checkpoint";
    } catch (const Mismatch& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (const std::string& message : messages)
    EXPECT_NE(message.find("0.weight gives [8, 12] for this rank, which holds [16, 12]"),
              std::string::npos)
        << message;
  fs::remove_all(dir);
}

TEST(ModelParallelEngineTest, BadOptionsAreNamed) {
  auto expectMessage = [](const ModelParallelOptions& options, const std::string& expected) {
    try {
      ModelParallelEngine engine(model, sgd, options);
      ADD_FAILURE() << "accepted; expected " << expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  expectMessage({.mesh = {.dp = 1, .pp = 2, .tp = 1}}, "needs 2 ranks, this job has 1");
  expectMessage({.microBatches = 0}, "microBatches must be at least 1");
  expectMessage({.sequenceParallel = true}, "sequenceParallel needs tp > 1");
  expectMessage({.splitAt = {2}}, "1 split points for 1 stages");
  // Measuring needs a sample; a loss of one's own cannot read logits split over tensor ranks.
  auto make = nativeRanks(2);
  runThreads(2, [&](int rank) {
    ModelParallelOptions pipeline{.communicator = make(rank), .mesh = {.dp = 1, .pp = 2, .tp = 1}};
    EXPECT_THROW(ModelParallelEngine(model, sgd, pipeline), InvalidArgument);
  });
  auto make2 = nativeRanks(2);
  runThreads(2, [&](int rank) {
    ModelParallelOptions tensor{.communicator = make2(rank), .mesh = {.dp = 1, .pp = 1, .tp = 2}};
    tensor.loss = [](const Tensor& out, const Tensor& y) { return crossEntropy(out, y); };
    EXPECT_THROW(ModelParallelEngine(model, sgd, tensor), InvalidArgument);
  });
}

}  // namespace
}  // namespace kolo::train
