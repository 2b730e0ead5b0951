// train::ElasticEngine under train::fit with ranks as threads over one memory store: a rank
// lost mid-epoch leaves the survivors to finish with one device's weights, every sample of
// each epoch used once; a joiner admitted at a step boundary receives the state and
// finishes with them; falling below the minimum saves the agreed state, which a one-device
// run resumes to the uninterrupted weights. In process, so each case takes a second, not a
// whole job under kolo run.
#include "parallel/elastic/store_keys.h"
#include "kolo/train/elastic.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "kolo/comm/stores.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/threads.h"
#include "kolo/train/faults.h"
#include "kolo/train/fit.h"

namespace kolo::train {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// 60 samples, global batch 6: 10 steps an epoch; 25 steps are two epochs and a half.
constexpr int64_t kSamples = 60, kBatch = 6, kStepsPerEpoch = 10, kSteps = 25;

std::shared_ptr<data::TensorDataset> dataset() {
  Generator gen(5);
  Tensor inputs = Tensor::rand({kSamples, 8}, gen);
  Generator mapGen(6);
  Tensor map = Tensor::rand({8, 3}, mapGen, -1.0, 1.0);
  return std::make_shared<data::TensorDataset>(inputs, argmax(matmul(inputs, map), 1));
}

std::shared_ptr<nn::Module> model() {
  Generator gen(3);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Linear>(8, 16, gen));
  net->add(std::make_shared<nn::ReLU>());
  net->add(std::make_shared<nn::Linear>(16, 3, gen));
  return net;
}

std::unique_ptr<optim::Optimizer> sgd(const parallel::NamedTensors& parameters) {
  return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
}

FitOptions fitOptions(observe::Logger& logger) {
  FitOptions options;
  options.steps = kSteps;
  options.batch = kBatch;
  options.seed = 11;
  options.prefetch = 0;
  options.quiet = true;
  options.logger = &logger;
  return options;
}

parallel::ElasticOptions elasticOptions(int minRanks, int maxRanks) {
  parallel::ElasticOptions options;
  options.minRanks = minRanks;
  options.maxRanks = maxRanks;
  options.native.timeout = 3s;
  return options;
}

ElasticEngineOptions engineOptions(observe::Logger& logger) {
  ElasticEngineOptions options;
  options.dataParallel.strategy.kind = parallel::StrategyKind::MultiWorkerMirrored;
  options.logger = &logger;
  return options;
}

// Runs fn(id) on `count` threads; returns each one's error message ("" when none).
std::vector<std::string> onThreads(int count, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  for (int id = 0; id < count; ++id)
    threads.emplace_back([&, id] {
      try {
        fn(id);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(id)] = e.what();
      }
    });
  for (auto& thread : threads) thread.join();
  return errors;
}

// The one-device weights after `kSteps` steps of the same global batches.
NamedTensors oneDeviceWeights(std::shared_ptr<data::TensorDataset> train, const std::string& resumeDir = "") {
  observe::Logger quiet(stderr, observe::LogLevel::Warn);
  DataParallelEngine engine(model, sgd, {});
  FitOptions options = fitOptions(quiet);
  options.resumeDir = resumeDir;
  fit(engine, train, nullptr, options);
  return engine.model().stateDict();
}

double maxRelativeDifference(const NamedTensors& got, const NamedTensors& expected) {
  double worst = 0.0;
  for (size_t t = 0; t < expected.size(); ++t) {
    const std::vector<float> x = got[t].second.toFloatVector(), y = expected[t].second.toFloatVector();
    double diff = 0.0, scale = 1e-12;
    for (size_t i = 0; i < y.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(y[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// What each rank trained on: per step, the newest generation's samples over the ranks.
class SampleRecord {
 public:
  void add(int64_t generation, int64_t step, const std::vector<int64_t>& indices) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& [newest, ids] = steps_[step];
    if (generation < newest) return;
    if (generation > newest) ids.clear();
    newest = generation;
    ids.insert(ids.end(), indices.begin(), indices.end());
  }
  // Every step's global batch complete, every sample of each epoch used once.
  void expectEverySampleOncePerEpoch() const {
    EXPECT_EQ(steps_.size(), static_cast<size_t>(kSteps));
    std::map<int64_t, std::multiset<int64_t>> perEpoch;
    for (const auto& [step, record] : steps_) {
      EXPECT_EQ(record.second.size(), static_cast<size_t>(kBatch)) << "step " << step;
      perEpoch[step / kStepsPerEpoch].insert(record.second.begin(), record.second.end());
    }
    for (const auto& [epoch, ids] : perEpoch) {
      const size_t expected = epoch < 2 ? kSamples : kSamples / 2;
      EXPECT_EQ(ids.size(), expected) << "epoch " << epoch;
      EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), expected) << "epoch " << epoch;
    }
  }

 private:
  std::mutex mutex_;
  std::map<int64_t, std::pair<int64_t, std::vector<int64_t>>> steps_;  // step -> generation, ids
};

class ElasticEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setNumThreads(1);
    dir_ = fs::temp_directory_path() / ("kolo_elastic_engine_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
  observe::Logger logger_{stderr, observe::LogLevel::Warn};
};

// Rank 2 of 3 is lost before step 7 (it leaves fit, and is marked lost as the launcher
// marks a dead rank): ranks 0 and 1 regroup, go on from step 7 with a shard of half the
// global batch each, and finish with one device's weights; the metrics name the change.
TEST_F(ElasticEngineTest, SurvivorsOfALostRankFinishWithOneDeviceWeights) {
  const auto train = dataset();
  auto store = comm::makeMemoryStore();
  SampleRecord samples;
  std::vector<NamedTensors> weights(3);
  std::vector<int64_t> steps(3, 0);
  const std::vector<std::string> errors = onThreads(3, [&](int id) {
    auto context = std::make_shared<parallel::ElasticContext>(store, id, 3, elasticOptions(2, 3));
    ElasticEngine engine(context, model, sgd, engineOptions(logger_));
    FitOptions options = fitOptions(logger_);
    options.metricsPath = file("metrics.jsonl");
    FitCallbacks callbacks;
    callbacks.onStepBegin = [&](int64_t step) {
      if (id != 2 || step != 7) return;
      store->setString(parallel::elasticLostKey(2), "lost");
      KOLO_THROW(Error, "rank 2 leaves before step 7");
    };
    callbacks.onStepEnd = [&](const StepEnd& end) {
      samples.add(context->generation(), end.step, end.batch->indices);
    };
    steps[static_cast<size_t>(id)] = fit(engine, train, nullptr, options, callbacks).steps;
    weights[static_cast<size_t>(id)] = engine.model().stateDict();
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[2].find("rank 2 leaves"), std::string::npos) << errors[2];
  samples.expectEverySampleOncePerEpoch();
  const NamedTensors expected = oneDeviceWeights(train);
  for (int id : {0, 1}) {
    EXPECT_EQ(steps[static_cast<size_t>(id)], kSteps);
    EXPECT_LE(maxRelativeDifference(weights[static_cast<size_t>(id)], expected), 1e-5) << "rank " << id;
  }
  // Against a vacuous pass: the weights moved from their start.
  EXPECT_GT(maxRelativeDifference(model()->stateDict(), expected), 1e-2);

  std::ifstream in(file("metrics.jsonl"));
  std::string lost;
  int64_t finalWorldSize = 0;
  bool recovered = false;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.value("event", "") == "membership") lost = record["lost"];
    if (record.value("event", "") == "recovered") recovered = true;
    if (record.value("final", false)) finalWorldSize = record["world_size"];
  }
  EXPECT_EQ(lost, "2");
  EXPECT_TRUE(recovered);
  EXPECT_EQ(finalWorldSize, 2);
}

// The fault plan's elastic hooks as a program of one's own uses them: each member's sample log
// holds its pid, then per step its generation, the step and the samples of its share; the
// regroup kill is meant for the member it names only; no kill recorded, no since_kill_s.
TEST_F(ElasticEngineTest, TheFaultPlansSampleLogHoldsEachMembersShareOfEveryStep) {
  const auto train = dataset();
  auto store = comm::makeMemoryStore();
  FaultPlan plan;
  plan.elastic.sampleLog = file("samples");
  plan.elastic.killInRegroup = 1;
  EXPECT_FALSE(killInRegroup(plan, 0));
  EXPECT_TRUE(killInRegroup(plan, 1));
  const std::vector<std::string> errors = onThreads(2, [&](int id) {
    auto context = std::make_shared<parallel::ElasticContext>(store, id, 2, elasticOptions(1, 2));
    ElasticEngine engine(context, model, sgd, engineOptions(logger_));
    fit(engine, train, nullptr, fitOptions(logger_), injectElasticFaults(plan, engine));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  SampleRecord samples;
  for (int id : {0, 1}) {
    std::ifstream in(file("samples") + ".rank-" + std::to_string(id));
    std::string line;
    ASSERT_TRUE(std::getline(in, line)) << "member " << id;
    EXPECT_EQ(line, "pid " + std::to_string(::getpid()));
    int64_t lines = 0;
    for (; std::getline(in, line); ++lines) {
      std::istringstream words(line);
      int64_t generation = -1, step = -1;
      words >> generation >> step;
      EXPECT_EQ(generation, 0) << line;
      EXPECT_EQ(step, lines) << line;
      std::vector<int64_t> ids;
      for (int64_t sample; words >> sample;) ids.push_back(sample);
      EXPECT_EQ(ids.size(), static_cast<size_t>(kBatch / 2)) << line;
      samples.add(generation, step, ids);
    }
    EXPECT_EQ(lines, kSteps) << "member " << id;
  }
  samples.expectEverySampleOncePerEpoch();
  observe::Fields fields;
  sinceKillField(store)(fields);
  EXPECT_TRUE(fields.empty());
}

// Ranks 0 and 1 run with room for a third; a joiner (launch rank 2) registers once they reach
// step 5, the members admit it at that boundary (rank 0 waits for it there), and it receives
// the state after 5 steps: all three finish with one device's weights, every sample once.
TEST_F(ElasticEngineTest, AJoinerReceivesTheStateAndFinishesWithTheMembers) {
  const auto train = dataset();
  auto store = comm::makeMemoryStore();
  SampleRecord samples;
  std::vector<NamedTensors> weights(3);
  std::optional<int64_t> joinedAt;
  std::promise<void> atStep5;
  std::shared_future<void> reachedStep5 = atStep5.get_future().share();
  const std::vector<std::string> errors = onThreads(3, [&](int id) {
    if (id == 2) reachedStep5.wait();
    std::shared_ptr<parallel::ElasticContext> context =
        id < 2 ? std::make_shared<parallel::ElasticContext>(store, id, 2, elasticOptions(1, 3))
               : parallel::ElasticContext::join(store, id, elasticOptions(1, 3));
    ASSERT_NE(context, nullptr);
    ElasticEngine engine(context, model, sgd, engineOptions(logger_));
    if (id == 2) joinedAt = engine.joinedAt();
    FitCallbacks callbacks;
    callbacks.onStepBegin = [&](int64_t step) {
      if (step != 5 || context->size() == 3) return;
      if (id == 0) atStep5.set_value();
      context->awaitJoiners(30s);
    };
    callbacks.onStepEnd = [&](const StepEnd& end) {
      samples.add(context->generation(), end.step, end.batch->indices);
    };
    fit(engine, train, nullptr, fitOptions(logger_), callbacks);
    weights[static_cast<size_t>(id)] = engine.model().stateDict();
  });
  for (int id = 0; id < 3; ++id) EXPECT_EQ(errors[static_cast<size_t>(id)], "") << "rank " << id;
  ASSERT_TRUE(joinedAt.has_value());
  EXPECT_EQ(*joinedAt, 5);
  samples.expectEverySampleOncePerEpoch();
  const NamedTensors expected = oneDeviceWeights(train);
  for (int id = 0; id < 3; ++id)
    EXPECT_LE(maxRelativeDifference(weights[static_cast<size_t>(id)], expected), 1e-5) << "rank " << id;
}

// Two ranks with a minimum of two: rank 1 is lost before step 7, so rank 0 stops with
// BelowMinRanksError after saving the state after step 7; a one-device run resumes it to
// the weights of an uninterrupted run (with momentum: the optimizer state is saved too).
TEST_F(ElasticEngineTest, BelowTheMinimumTheAgreedStateIsSavedAndResumes) {
  const auto train = dataset();
  auto store = comm::makeMemoryStore();
  const std::vector<std::string> errors = onThreads(2, [&](int id) {
    auto context = std::make_shared<parallel::ElasticContext>(store, id, 2, elasticOptions(2, 2));
    ElasticEngine engine(context, model, sgd, engineOptions(logger_));
    FitOptions options = fitOptions(logger_);
    options.checkpointDir = file("checkpoints");
    FitCallbacks callbacks;
    callbacks.onStepBegin = [&](int64_t step) {
      if (id != 1 || step != 7) return;
      store->setString(parallel::elasticLostKey(1), "lost");
      KOLO_THROW(Error, "rank 1 leaves before step 7");
    };
    try {
      fit(engine, train, nullptr, options, callbacks);
    } catch (const parallel::BelowMinRanksError& stop) {
      EXPECT_EQ(stop.change().step, 7);
      throw;
    }
  });
  EXPECT_NE(errors[0].find("below ElasticOptions::minRanks 2"), std::string::npos) << errors[0];
  ASSERT_TRUE(fs::exists(file("checkpoints") + "/ckpt-000000007"));
  EXPECT_LE(maxRelativeDifference(oneDeviceWeights(train, file("checkpoints")), oneDeviceWeights(train)), 1e-5);
}

TEST_F(ElasticEngineTest, RefusesANullContextAndAnotherStrategy) {
  EXPECT_THROW(ElasticEngine(nullptr, model, sgd, {}), InvalidArgument);
  auto context = std::make_shared<parallel::ElasticContext>(comm::makeMemoryStore(), 0, 1,
                                                            elasticOptions(1, 1));
  ElasticEngineOptions options = engineOptions(logger_);
  options.dataParallel.strategy.kind = parallel::StrategyKind::OneDevice;
  try {
    ElasticEngine engine(context, model, sgd, options);
    FAIL() << "one-device was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("elastic training is multi-worker-mirrored, not one-device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolo::train
