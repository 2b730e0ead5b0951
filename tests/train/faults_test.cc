// FaultPlan in-process: the text forms parse into the plan and bad ones are named with their
// form; fit's callbacks carry each fault out on its rank only (a failure thrown before its
// step, a weight perturbed that check-sync then names, a NaN the anomaly detector names, a
// slow rank that sleeps), a parameter-server job's worker faults at their push, and a kill
// raises its signal in a child process.
#include "kolo/train/faults.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/numerics.h"
#include "kolo/train/parameter_server.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

using parallel::testing::nativeRanks;
using parallel::testing::runThreads;

std::shared_ptr<nn::Module> model() {
  Generator gen(3);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8, gen), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3, gen)});
}

std::unique_ptr<optim::Optimizer> sgd(const parallel::NamedTensors& parameters) {
  return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.1});
}

// Trains 6 steps on 2 thread ranks with `plan` injected (and `change` applied to the options);
// returns each rank's error message ("" when it finished).
std::vector<std::string> trainWith(const FaultPlan& plan, const std::function<void(FitOptions&, DataParallelEngine&, int)>& change = nullptr) {
  const auto train = testing::argmaxDataset(256, 6, 3);
  observe::Logger logger(stderr, observe::LogLevel::Error);
  // A short deadline: a rank that fails leaves its peer waiting in a collective until then.
  auto make = nativeRanks(2, std::chrono::seconds(5));
  std::vector<std::string> errors(2);
  runThreads(2, [&](int rank) {
    try {
      DataParallelOptions options;
      options.strategy.kind = parallel::StrategyKind::MultiWorkerMirrored;
      options.strategy.communicator = make(rank);
      DataParallelEngine engine(model, sgd, options);
      FitOptions fitOptions;
      fitOptions.batch = 32;
      fitOptions.steps = 6;
      fitOptions.quiet = true;
      fitOptions.prefetch = 0;
      fitOptions.logger = &logger;
      if (change) change(fitOptions, engine, rank);
      fit(engine, train, nullptr, fitOptions,
          injectFaults(plan, rank, {}, &engine.model(), fitOptions.anomalyDetector.get()));
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  return errors;
}

TEST(FaultPlanTest, TextFormsParseAndBadOnesAreNamed) {
  const FaultPlan::Kill kill = FaultPlan::parseKill("1,3:40:STOP", "--kill");
  EXPECT_EQ(kill.ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(kill.step, 40);
  EXPECT_EQ(kill.signal, SIGSTOP);
  EXPECT_EQ(FaultPlan::parseKill("2:5", "--kill").signal, SIGKILL);
  EXPECT_EQ(FaultPlan::parseFail("7", "--fail").rank, 0);
  EXPECT_EQ(FaultPlan::parseFail("7:2", "--fail").rank, 2);
  EXPECT_DOUBLE_EQ(FaultPlan::parseSlow("1:2.5", "--slow").factor, 2.5);
  const FaultPlan::Nan nan = FaultPlan::parseNan("5:1:2:grad", "--nan");
  EXPECT_EQ(nan.step, 5);
  EXPECT_EQ(nan.rank, 1);
  EXPECT_EQ(nan.module, "2");
  EXPECT_TRUE(nan.gradient);
  EXPECT_EQ(FaultPlan::parsePerturb("3:1:0.weight", "--perturb").tensor, "0.weight");
  for (const auto& [bad, parse] :
       std::vector<std::pair<std::string, std::function<void(const std::string&)>>>{
           {"x:5", [](const std::string& t) { FaultPlan::parseKill(t, "--kill"); }},
           {"1:5:TERM", [](const std::string& t) { FaultPlan::parseKill(t, "--kill"); }},
           {"-1", [](const std::string& t) { FaultPlan::parseFail(t, "--kill"); }},
           {"1:0.5", [](const std::string& t) { FaultPlan::parseSlow(t, "--kill"); }},
           {"5:1", [](const std::string& t) { FaultPlan::parseNan(t, "--kill"); }},
           {"3:1:", [](const std::string& t) { FaultPlan::parsePerturb(t, "--kill"); }}}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--kill '" + bad + "' is not accepted: use "), std::string::npos)
          << e.what();
    }
  }
}

TEST(FaultPlanTest, AFailureStrikesItsRankBeforeItsStep) {
  FaultPlan plan;
  plan.fail = {.rank = 1, .step = 3};
  const std::vector<std::string> errors = trainWith(plan);
  EXPECT_NE(errors[1].find("rank 1: failure injected before step 3"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0], "") << "rank 0 finished without its peer";
}

TEST(FaultPlanTest, APerturbedWeightIsNamedByCheckSync) {
  FaultPlan plan;
  plan.perturb = {.rank = 1, .step = 2, .tensor = "2.bias"};
  const std::vector<std::string> errors =
      trainWith(plan, [](FitOptions& options, DataParallelEngine&, int) { options.checkSyncEvery = 1; });
  for (const std::string& error : errors) EXPECT_NE(error.find("2.bias"), std::string::npos) << error;
  plan.perturb.tensor = "9.weight";
  EXPECT_NE(trainWith(plan)[0].find("the model has no tensor '9.weight' to perturb; it has 0.weight"),
            std::string::npos);
}

TEST(FaultPlanTest, AnInjectedNanIsNamedByTheAnomalyDetector) {
  FaultPlan plan;
  plan.nan = {.rank = 0, .step = 4, .module = "1"};
  const std::vector<std::string> errors = trainWith(plan, [](FitOptions& options, DataParallelEngine& engine, int rank) {
    options.anomalyDetector = std::make_shared<observe::AnomalyDetector>(
        engine.model(), observe::AnomalyOptions{.parameterGradients = false, .rank = rank});
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("step 4"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
  }
  EXPECT_NE(trainWith(plan)[0].find("needs an anomaly detector"), std::string::npos);
}

TEST(FaultPlanTest, AKillRaisesItsSignalOnItsRankOnly) {
  FaultPlan plan;
  plan.kill = {.ranks = {2}, .step = 5, .signal = SIGKILL};
  for (const int rank : {1, 2}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (int64_t step = 0; step < 8; ++step) plan.strike(rank, step);
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    if (rank == 2) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }
}

TEST(FaultPlanTest, ASlowRankSleepsItsFactorOfTheComputeBeforeEachStep) {
  FaultPlan plan;
  plan.slow = {.rank = 1, .factor = 3.0};
  for (const int rank : {0, 1}) {
    std::vector<int64_t> order;
    FitCallbacks inner;
    inner.onStepBegin = [&](int64_t step) { order.push_back(step); };
    const FitCallbacks callbacks = injectFaults(plan, rank, inner);
    callbacks.onStepBegin(0);
    callbacks.onStepEnd({.step = 0, .computeSeconds = 0.05});
    const auto start = std::chrono::steady_clock::now();
    callbacks.onStepBegin(1);
    const double slept = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(order, (std::vector<int64_t>{0, 1})) << "the inner callbacks run too";
    // At least (3 - 1) x 50 ms on the slow rank (a lower bound: a sleep never ends early).
    if (rank == 1) {
      EXPECT_GE(slept, 0.1);
    }
  }
}

// A parameter-server job's workers: the slow worker (by worker index) sleeps its factor of
// the batch's compute before each push, and the failure strikes its launch rank at its push.
TEST(FaultPlanTest, WorkerFaultsStrikeBeforeTheirPush) {
  FaultPlan plan;
  plan.slow = {.rank = 1, .factor = 3.0};
  plan.fail = {.rank = 4, .step = 2};
  const ParameterServerCallbacks callbacks = injectWorkerFaults(plan, 4);
  const auto start = std::chrono::steady_clock::now();
  callbacks.beforePush({.worker = 1, .push = 0, .seconds = 0.05});
  const double slept = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(slept, 0.1) << "at least (3 - 1) x 50 ms: a sleep never ends early";
  EXPECT_NO_THROW(callbacks.beforePush({.worker = 0, .push = 1, .seconds = 0.0}));
  try {
    callbacks.beforePush({.worker = 0, .push = 2, .seconds = 0.0});
    FAIL() << "no failure before push 2 on rank 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 4: failure injected before push 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(injectWorkerFaults(plan, 3).beforePush({.worker = 0, .push = 2, .seconds = 0.0}));
}

}  // namespace
}  // namespace kolo::train
