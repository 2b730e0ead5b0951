// Pipeline = the unsplit model: P = 2 and 4 stages as threads over the native communicator,
// M = 1, 4 and 8 micro-batches, GPipe and 1F1B, with and without recomputation; after 10
// SGD steps every loss and every weight equals one-rank training on the whole batch to 1e-5
// of the largest value. Also the mlp and the cnn, the activation bound of each schedule, and a run
// with split points chosen by measured cost.
#include <gtest/gtest.h>

#include <tuple>

#include "pipeline_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

constexpr double kTolerance = 1e-5;

const PipeResult& lmReference() {
  static const PipeResult reference = trainUnsplit({"lm"});
  return reference;
}

void expectSame(const PipeResult& got, const PipeResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  EXPECT_LT(maxRelDiff(got.losses, want.losses), kTolerance) << what << ": losses";
  ASSERT_EQ(got.state.size(), want.state.size());
  for (size_t i = 0; i < got.state.size(); ++i) EXPECT_EQ(got.state[i].first, want.state[i].first);
  EXPECT_LT(maxRelDiff(stateValues(got.state), stateValues(want.state)), kTolerance) << what << ": weights";
  // Training lowers the loss of the first batch when it comes round again (steps alternate
  // between two batches), so the weights compared are trained ones.
  const size_t again = (want.losses.size() - 1) & ~size_t{1};
  EXPECT_GT(want.losses.front() - want.losses[again], 0.02) << "the reference does not learn";
}

class PipelineEquivalence
    : public ::testing::TestWithParam<std::tuple<int, int, PipelineSchedule, bool>> {};

TEST_P(PipelineEquivalence, LmMatchesUnsplitModel) {
  const auto [stages, micro, schedule, recompute] = GetParam();
  PipelineOptions options{.microBatches = micro, .schedule = schedule, .recompute = recompute};
  const PipeResult got = trainPipelined({"lm"}, stages, options);
  expectSame(got, lmReference(),
             "P=" + std::to_string(stages) + " M=" + std::to_string(micro) + " " +
                 pipelineScheduleName(schedule) + (recompute ? " recompute" : ""));
}

INSTANTIATE_TEST_SUITE_P(
    StagesMicroBatchesSchedules, PipelineEquivalence,
    ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 4, 8),
                       ::testing::Values(PipelineSchedule::GPipe, PipelineSchedule::OneFOneB),
                       ::testing::Bool()));

TEST(PipelineEquivalenceSchedules, GPipeAndOneFOneBGiveBitIdenticalWeights) {
  // Both run the backwards in micro-batch order, so gradients add up in the same order.
  const PipeResult gpipe = trainPipelined({"lm", 4}, 4, {.microBatches = 8, .schedule = PipelineSchedule::GPipe});
  const PipeResult oneFOneB =
      trainPipelined({"lm", 4}, 4, {.microBatches = 8, .schedule = PipelineSchedule::OneFOneB, .recompute = true});
  EXPECT_EQ(gpipe.losses, oneFOneB.losses);
  EXPECT_EQ(stateValues(gpipe.state), stateValues(oneFOneB.state));
}

TEST(PipelineEquivalenceMlp, TwoAndThreeStagesMatchUnsplitModel) {
  const PipeResult reference = trainUnsplit({"mlp", 5});
  for (int stages : {2, 3}) {
    const PipeResult got =
        trainPipelined({"mlp", 5}, stages, {.microBatches = 4, .schedule = PipelineSchedule::OneFOneB});
    expectSame(got, reference, "mlp P=" + std::to_string(stages));
  }
}

TEST(PipelineEquivalenceCnn, ThreeStagesMatchUnsplitModel) {
  // Convolutions, pooling and the reshapes between them cut into stages.
  const PipeResult reference = trainUnsplit({"cnn", 3});
  const PipeResult got = trainPipelined({"cnn", 3}, 3, {.microBatches = 2, .schedule = PipelineSchedule::GPipe},
                                        {2, 7});
  expectSame(got, reference, "cnn P=3");
}

void expectSameBatchNorm(const PipeResult& got, const PipeResult& reference, double batches) {
  ASSERT_EQ(got.losses.size(), reference.losses.size());
  EXPECT_LT(maxRelDiff(got.losses, reference.losses), kTolerance);
  ASSERT_EQ(got.state.size(), reference.state.size());
  bool sawRunningVar = false;
  for (size_t i = 0; i < got.state.size(); ++i) {
    const auto& [name, tensor] = got.state[i];
    EXPECT_EQ(name, reference.state[i].first);
    EXPECT_LT(maxRelDiff(flatValues({got.state[i]}), flatValues({reference.state[i]})), kTolerance) << name;
    if (name == "layer3.bn2.running_var") sawRunningVar = true;
    if (name.ends_with("num_batches_tracked")) {
      EXPECT_EQ(tensor.item(), batches) << name;
    }
  }
  EXPECT_TRUE(sawRunningVar);
}

TEST(PipelineEquivalenceBatchNorm, StagesEqualOneDeviceRunningTheSameMicroBatches) {
  // Batch norm normalises each micro-batch with its own statistics (PyTorch's pipelining):
  // two stages equal one device running the same 4 micro-batches, running statistics and
  // num_batches_tracked included, gathered under the whole model's names; recomputation
  // moves the running statistics once per micro-batch too.
  constexpr int kMicro = 4;
  const PipeResult reference = trainMicroBatched({"resnet", 3}, kMicro);
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    const PipeResult got = trainPipelined(
        {"resnet", 3}, 2, {.microBatches = kMicro, .schedule = PipelineSchedule::OneFOneB, .recompute = recompute});
    expectSameBatchNorm(got, reference, 3.0 * kMicro);
  }
}

TEST(PipelineActivations, OneFOneBHoldsAtMostPMicroBatchesGPipeHoldsM) {
  constexpr int kStages = 4, kMicro = 8;
  for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    const PipeResult got = trainPipelined({"lm", 2}, kStages, {.microBatches = kMicro, .schedule = schedule});
    for (int s = 0; s < kStages; ++s) {
      const PipelineStepStats& stats = got.lastStats[static_cast<size_t>(s)];
      if (schedule == PipelineSchedule::GPipe) {
        EXPECT_EQ(stats.peakMicroBatchesHeld, kMicro) << "gpipe stage " << s;
      } else {
        // PipeDream-Flush: stage s warms up with P - s - 1 forwards, so it holds P - s.
        EXPECT_EQ(stats.peakMicroBatchesHeld, kStages - s) << "1f1b stage " << s;
        EXPECT_LE(stats.peakMicroBatchesHeld, kStages);
      }
      EXPECT_GT(stats.peakBoundaryBytes, 0u);
    }
  }
}

TEST(PipelineSplit, MeasuredSplitTrainsLikeTheUnsplitModel) {
  // Rank 0 times the layers and every rank takes its partition; whatever it chose, the math
  // is the unsplit model's.
  constexpr int kStages = 3;
  std::vector<std::vector<int>> chosen(kStages);
  auto commFor = nativeRanks(kStages);
  runThreads(kStages, [&](int rank) {
    auto comm = commFor(rank);
    auto model = makePipeModel("lm");
    chosen[static_cast<size_t>(rank)] = measuredSplit(*comm, *model, pipeBatch("lm", 0).first, 2);
  });
  ASSERT_EQ(chosen[0].size(), 2u);
  EXPECT_EQ(chosen[1], chosen[0]);
  EXPECT_EQ(chosen[2], chosen[0]);
  const PipeResult got = trainPipelined({"lm"}, kStages, {.microBatches = 2}, chosen[0]);
  expectSame(got, lmReference(), "measured split");
}

TEST(PipelineStageNames, StagesHoldTheWholeModelsNames) {
  auto model = makePipeModel("lm");
  std::vector<std::string> names;
  for (const auto& [name, t] : model->namedParameters()) names.push_back(name);
  std::vector<std::string> joined;
  for (auto [b, e] : {std::pair{0, 2}, std::pair{2, 5}, std::pair{5, 6}}) {
    StageModule stage(*model, b, e);
    for (const auto& [name, t] : stage.namedParameters()) joined.push_back(name);
  }
  EXPECT_EQ(joined, names);
  EXPECT_EQ(names.front(), "0.tok.weight");
  EXPECT_EQ(names.back(), "5.weight");
}

TEST(PipelineErrors, BadSplitsAndBatchesAreNamed) {
  auto model = makePipeModel("lm");
  EXPECT_THROW(PipelineStage(nullptr, *model, {3}, {}, pipeLoss("lm"), pipeOptimizer), InvalidArgument);
  PipelineStage stage(nullptr, *model, {}, {.microBatches = 3}, pipeLoss("lm"), pipeOptimizer);
  auto [x, y] = pipeBatch("lm", 0);
  try {
    stage.trainStep(x, y);
    ADD_FAILURE() << "a batch of 8 split into 3 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("8 rows cannot be split into 3"), std::string::npos) << e.what();
  }
  auto commFor = nativeRanks(2);
  runThreads(2, [&](int rank) {
    auto comm = commFor(rank);
    auto m = makePipeModel("lm");
    EXPECT_THROW(PipelineStage(comm, *m, {6}, {}, pipeLoss("lm"), pipeOptimizer), InvalidArgument);
    EXPECT_THROW(PipelineStage(comm, *m, {2, 4}, {}, pipeLoss("lm"), pipeOptimizer), InvalidArgument);
  });
}

}  // namespace
}  // namespace kolo::parallel
