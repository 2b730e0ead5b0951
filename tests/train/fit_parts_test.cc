// fit's pieces one by one (src/train/fit_*.h): the plan's lengths and its refusals in the
// options' words, the checks after a step that stop a run, and when a checkpoint is due.
// The whole loop's behaviour (resume, metrics schema, records) is fit_test.cc's.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "train/fit_checkpoints.h"
#include "train/fit_plan.h"
#include "train/fit_stopping.h"
#include "train/train_fixtures.h"

namespace kolo::train::detail {
namespace {

FitOptions lengthOptions(int64_t epochs, int64_t steps, int64_t batch) {
  FitOptions options;
  options.epochs = epochs;
  options.steps = steps;
  options.batch = batch;
  return options;
}

TEST(FitPlan, StepsCutEpochsShortOrSetTheLengthAlone) {
  // 100 samples at 32: 3 steps an epoch (the last, short, batch dropped).
  const FitPlan both = planFit(lengthOptions(4, 7, 32), 100);
  EXPECT_EQ(both.stepsPerEpoch, 3);
  EXPECT_EQ(both.totalSteps, 7);
  EXPECT_EQ(both.epochs, 3);
  EXPECT_EQ(planFit(lengthOptions(2, 0, 32), 100).totalSteps, 6);
  EXPECT_EQ(planFit(lengthOptions(0, 10, 32), 100).totalSteps, 10);
  EXPECT_EQ(planFit(lengthOptions(0, 0, 32), 100).totalSteps, 3);  // one epoch
  // An epoch's end is the next epoch's start.
  EXPECT_EQ(both.positionOf(6).epoch, 2);
  EXPECT_EQ(both.positionOf(6).batch, 0);
  EXPECT_EQ(both.positionOf(7).batch, 1);
  FitOptions padded = lengthOptions(1, 0, 32);
  padded.dropLast = false;
  EXPECT_EQ(planFit(padded, 100).stepsPerEpoch, 4);
}

TEST(FitPlan, BadOptionsAreNamedAsTheLibrarySpellsThem) {
  struct Case {
    std::function<void(FitOptions&)> change;
    std::string said;
  };
  for (const Case& c : std::vector<Case>{
           {[](FitOptions& o) { o.batch = 0; }, "FitOptions::batch must be at least 1, got 0"},
           {[](FitOptions& o) { o.batch = 101; }, "FitOptions::batch 101 is larger than the training set's 100 samples"},
           {[](FitOptions& o) { o.steps = -1; }, "FitOptions::steps must be at least 0, got -1"},
           {[](FitOptions& o) { o.checkpointEvery = -2; }, "FitOptions::checkpointEvery must be at least 0"},
           {[](FitOptions& o) { o.metricsEvery = 0; }, "FitOptions::metricsEvery must be at least 1"}}) {
    FitOptions options = lengthOptions(1, 0, 32);
    c.change(options);
    try {
      planFit(options, 100);
      ADD_FAILURE() << c.said << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.said), std::string::npos) << e.what();
    }
  }
}

class StoppingTest : public ::testing::Test {
 protected:
  static std::unique_ptr<DataParallelEngine> oneDevice() {
    DataParallelOptions options;
    options.strategy.kind = parallel::StrategyKind::OneDevice;
    return std::make_unique<DataParallelEngine>(
        [] {
          Generator gen(1);
          return std::make_shared<nn::Linear>(3, 2, gen);
        },
        testing::sgd, options);
  }
};

TEST_F(StoppingTest, ALossThatIsNotFiniteEndsTheRunNamingTheStepAndRate) {
  auto engine = oneDevice();
  const FitOptions options;
  EXPECT_NO_THROW(checkStep(options, *engine, nullptr, 4, 0.5, 0.1));
  try {
    checkStep(options, *engine, nullptr, 4, std::numeric_limits<double>::quiet_NaN(), 0.1);
    FAIL() << "a NaN loss went on";
  } catch (const DivergedError& e) {
    EXPECT_NE(std::string(e.what()).find("at step 4 (lr 0.1)"), std::string::npos) << e.what();
  }
}

TEST_F(StoppingTest, NoSigtermMeansNoStopAndCheckpointsAreDueByTheirSteps) {
  const TerminateRequests requests(true);
  EXPECT_FALSE(requests.agreed(nullptr));
  auto engine = oneDevice();
  FitOptions options = lengthOptions(1, 0, 4);
  options.checkpointEvery = 5;
  const FitPlan plan = planFit(options, 40);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  const FitCheckpoints checkpoints(*engine, options, plan, nullptr, logger);
  EXPECT_FALSE(checkpoints.due(4));
  EXPECT_TRUE(checkpoints.due(10));
}

}  // namespace
}  // namespace kolo::train::detail
