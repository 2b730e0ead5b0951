// The llama lm (RMSNorm, rotary grouped-query attention, SwiGLU, tied embeddings) in every
// layout that keeps its layers whole, ranks as threads: 10 SGD steps on a 2-stage pipeline
// (the model built whole, and built by parts with the tie named), with per-stage
// recomputation, on two data-parallel replicas and on a dp=2 x pp=2 mesh give one process's
// weights; a pipeline that does not sum the tied copies' gradients does not (the negative
// control), and a checkpoint of the pipeline resumes on one process.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kolo/byte_corpus.h"
#include "kolo/error.h"
#include "kolo/nn/language_model.h"
#include "kolo/parallel/tied_parameters.h"
#include "kolo/train/fit.h"
#include "kolo/train/model_parallel.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

namespace fs = std::filesystem;
using parallel::testing::nativeRanks;
using parallel::testing::runThreads;
using testing::maxAbsDiff;
using testing::weights;

// 2 blocks of width 16, 4 query and 2 key/value heads: layers 0 (embedding) .. 4 (head).
const nn::LanguageModelConfig kSizes{.vocab = 256, .layers = 2, .dModel = 16, .heads = 4, .seqLen = 8,
                                     .arch = nn::LanguageModelArch::Llama, .kvHeads = 2};

std::shared_ptr<nn::Sequential> llama() {
  Generator gen(7);
  return nn::makeLanguageModel(kSizes, gen);
}

std::shared_ptr<nn::Sequential> llamaPart(int begin, int end) {
  Generator gen(7);
  return nn::makeLanguageModelPart(kSizes, gen, begin, end < 0 ? kSizes.layers + 3 : end);
}

std::unique_ptr<optim::Optimizer> sgd(const parallel::NamedTensors& parameters) {
  return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.5, .momentum = 0.9});
}

std::shared_ptr<data::ByteWindows> windows(double heldOut) {
  std::vector<uint8_t> text;
  for (int i = 0; i < 900; ++i) text.push_back(static_cast<uint8_t>("a llama trains on bytes. "[i % 25] + (i % 11 == 0)));
  return std::make_shared<data::ByteWindows>(std::make_shared<data::ByteCorpus>(text, 8, heldOut, "test text"));
}

struct Layout {
  parallel::MeshShape mesh{};
  std::vector<int> splitAt{};
  bool parts = false;         // each stage builds only its layers (modelPart)
  bool nameTheTie = true;     // with parts: ModelParallelOptions::tiedParameters
  bool recompute = false;
};

// Trains `steps` steps in `layout` and returns rank 0's whole weights (every state-dict entry).
std::vector<float> trainIn(const Layout& layout, int64_t steps, const std::function<void(FitOptions&)>& change = {}) {
  const auto train = windows(0.1);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  std::vector<float> result;
  auto run = [&](std::shared_ptr<comm::Communicator> comm) {
    ModelParallelOptions options;
    options.communicator = comm;
    options.mesh = layout.mesh;
    options.microBatches = layout.mesh.pp > 1 ? 2 : 1;
    options.splitAt = layout.splitAt;
    options.recompute = layout.recompute;
    options.loss = nn::languageModelLoss;
    if (layout.parts) options.modelPart = llamaPart;
    if (layout.parts && layout.nameTheTie) options.tiedParameters = {{"0.weight", "4.weight"}};
    ModelParallelEngine engine(llama, sgd, options);
    FitOptions fit;
    fit.batch = 8;
    fit.seed = 5;
    fit.quiet = true;
    fit.logger = &logger;
    fit.prefetch = 0;
    fit.steps = steps;
    if (change) change(fit);
    train::fit(engine, train, nullptr, fit);
    engine.gatherModel();
    if (engine.isPrimary()) result = weights(engine.model());
  };
  if (layout.mesh.size() == 1) {
    run(nullptr);
  } else {
    auto make = nativeRanks(layout.mesh.size());
    runThreads(layout.mesh.size(), [&](int rank) { run(make(rank)); });
  }
  return result;
}

TEST(LlamaLayouts, TheTiedHeadIsOneParameterUnderTwoNames) {
  auto model = llama();
  const auto ties = parallel::tiedParameters(*model);
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].first, "0.weight");
  EXPECT_EQ(ties[0].second, "4.weight");
  int64_t listed = 0;
  for (const auto& [name, p] : model->namedParameters()) listed += name == "4.weight";
  EXPECT_EQ(listed, 0) << "namedParameters() lists the tied table twice";
}

TEST(LlamaLayouts, EveryLayoutTakesTheStepsOfOneProcess) {
  const std::vector<float> initial = weights(*llama());
  const std::vector<float> one = trainIn({}, 10);
  ASSERT_GT(maxAbsDiff(one, initial), 1e-2) << "training did not move the weights";
  const std::vector<std::pair<std::string, Layout>> layouts = {
      {"pipeline", {.mesh = {.dp = 1, .pp = 2, .tp = 1}, .splitAt = {2}}},
      {"pipeline by parts", {.mesh = {.dp = 1, .pp = 2, .tp = 1}, .splitAt = {3}, .parts = true}},
      {"pipeline recomputing", {.mesh = {.dp = 1, .pp = 2, .tp = 1}, .splitAt = {2}, .recompute = true}},
      {"data parallel", {.mesh = {.dp = 2, .pp = 1, .tp = 1}}},
      {"mesh dp=2,pp=2", {.mesh = {.dp = 2, .pp = 2, .tp = 1}, .splitAt = {2}, .parts = true}}};
  for (const auto& [name, layout] : layouts)
    EXPECT_LT(maxAbsDiff(trainIn(layout, 10), one), 1e-5) << name;
  // The negative control: stages that hold copies of the table and do not sum their
  // gradients train two different tables.
  const Layout untied{.mesh = {.dp = 1, .pp = 2, .tp = 1}, .splitAt = {2}, .parts = true, .nameTheTie = false};
  EXPECT_GT(maxAbsDiff(trainIn(untied, 10), one), 1e-3) << "the check cannot tell an untied pipeline";
}

TEST(LlamaLayouts, APipelinesCheckpointResumesOnOneProcess) {
  const std::string dir = testing::freshDir("kolo_llama_layouts_test", "resume");
  const std::vector<float> straight = trainIn({}, 8);
  const Layout pipeline{.mesh = {.dp = 1, .pp = 2, .tp = 1}, .splitAt = {2}, .parts = true};
  trainIn(pipeline, 4, [&](FitOptions& o) {
    o.checkpointDir = dir;
    o.checkpointEvery = 4;
  });
  const std::vector<float> resumed = trainIn({}, 8, [&](FitOptions& o) { o.resumeDir = dir; });
  EXPECT_LT(maxAbsDiff(straight, resumed), 1e-5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kolo::train
