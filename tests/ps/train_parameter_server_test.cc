// train::trainParameterServer with the roles as threads of the test (options.role) sharing a
// TCP store: one sync worker takes one device's steps (the same data order and updates, so
// the same weights as train::fit on one device), `steps` counts the servers' updates and cuts
// the last epoch short, the chief's checkpoint resumes to the weights of a run that went
// straight through, and every role returns its summary.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "kolo/checkpoint.h"
#include "kolo/comm/stores.h"
#include "kolo/train/engine.h"
#include "kolo/train/fit.h"
#include "kolo/train/parameter_server.h"
#include "launcher/process_helpers.h"
#include "ps_harness.h"

namespace kolo::parallel::ps::testing {
namespace {

OptimizerFactory sgdMomentum() {
  return [](const NamedTensors& parameters) {
    return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  };
}

/// What the roles of one job returned, and the weights the chief's model ended with.
struct JobResult {
  std::vector<train::ParameterServerSummary> summaries;  // server, chief, worker 0, 1, ...
  std::vector<float> chiefWeights;
};

/// One job of 1 server, the chief and `workers` workers, each a thread calling
/// trainParameterServer with its role, through a store of the test's own.
JobResult runJob(int workers, std::shared_ptr<const data::Dataset> train,
                 std::shared_ptr<const data::Dataset> validation,
                 train::ParameterServerOptions options) {
  comm::TcpStoreServer store(comm::TcpStoreServerOptions{.host = "127.0.0.1", .token = kToken});
  const std::string address = "127.0.0.1:" + std::to_string(store.port());
  std::vector<RoleInfo> roles = {{Role::Server, 0, 1, workers, address, kToken},
                                 {Role::Chief, 0, 1, workers, address, kToken}};
  for (int w = 0; w < workers; ++w) roles.push_back({Role::Worker, w, 1, workers, address, kToken});
  observe::Logger quiet(stderr, observe::LogLevel::Warn);
  options.logger = &quiet;
  options.quiet = true;
  JobResult result;
  result.summaries.resize(roles.size());
  std::vector<std::shared_ptr<nn::Module>> built(roles.size());
  std::vector<std::exception_ptr> errors(roles.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < roles.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        train::ParameterServerOptions mine = options;
        mine.role = roles[r];
        result.summaries[r] = train::trainParameterServer(
            [&built, r] { return built[r] = makeMlp(); }, sgdMomentum(), train,
            roles[r].role == Role::Chief ? validation : nullptr, mine);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  for (const auto& [name, p] : built[1]->namedParameters()) {
    const std::vector<float> v = p.toFloatVector();
    result.chiefWeights.insert(result.chiefWeights.end(), v.begin(), v.end());
  }
  return result;
}

/// Weights of the mlp after `epochs` epochs of train::fit on one device, global batch 64,
/// checkpointed into `checkpointDir` at the end ("" : not).
std::vector<float> oneDeviceWeights(std::shared_ptr<const data::Dataset> train, int64_t epochs,
                                    const std::string& checkpointDir = "") {
  train::DataParallelOptions single;
  single.strategy.kind = StrategyKind::OneDevice;
  train::DataParallelEngine engine(makeMlp, sgdMomentum(), single);
  observe::Logger quiet(stderr, observe::LogLevel::Warn);
  train::FitOptions options;
  options.epochs = epochs;
  options.batch = 64;
  options.quiet = true;
  options.logger = &quiet;
  options.checkpointDir = checkpointDir;
  train::fit(engine, train, nullptr, options);
  std::vector<float> flat;
  for (const auto& [name, p] : engine.model().namedParameters()) {
    const std::vector<float> v = p.toFloatVector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

std::vector<float> flatWeights(nn::Module& model) {
  std::vector<float> flat;
  for (const auto& [name, p] : model.namedParameters()) {
    const std::vector<float> v = p.toFloatVector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

double maxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

class TrainParameterServer : public kolo::testing::TempDirTest {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    TempDirTest::SetUp();
    const Samples samples = firstSamples(1000);
    train_ = std::make_shared<data::TensorDataset>(samples.x.slice(0, 0, 640).contiguous(),
                                                   samples.y.slice(0, 0, 640).contiguous());
    test_ = std::make_shared<data::TensorDataset>(samples.x.slice(0, 640, 1000).contiguous(),
                                                  samples.y.slice(0, 640, 1000).contiguous());
  }

  static train::ParameterServerOptions syncOptions(int64_t epochs) {
    train::ParameterServerOptions options;
    options.mode = Mode::Sync;
    options.batch = 64;  // 10 steps an epoch of 640 samples
    options.epochs = epochs;
    options.unitBatches = 4;
    options.timeout = std::chrono::seconds(60);
    return options;
  }

  std::shared_ptr<data::TensorDataset> train_, test_;
};

TEST_F(TrainParameterServer, OneSyncWorkerTakesOneDevicesSteps) {
  const JobResult job = runJob(1, train_, test_, syncOptions(2));
  const std::vector<float> reference = oneDeviceWeights(train_, 2);
  ASSERT_EQ(job.chiefWeights.size(), reference.size());
  EXPECT_LT(maxRelativeDifference(job.chiefWeights, reference), 1e-6);
  // Not vacuous: the weights moved from their initial values.
  const JobResult none = runJob(1, train_, test_, [] {
    train::ParameterServerOptions options = syncOptions(1);
    options.steps = 1;
    return options;
  }());
  EXPECT_GT(maxRelativeDifference(none.chiefWeights, reference), 1e-3);

  const train::ParameterServerSummary& chief = job.summaries[1];
  EXPECT_EQ(chief.role, Role::Chief);
  // The chief's summary carries the model that holds the trained weights.
  ASSERT_NE(chief.model, nullptr);
  EXPECT_EQ(flatWeights(*chief.model), job.chiefWeights);
  EXPECT_EQ(job.summaries[0].model, nullptr);
  EXPECT_EQ(chief.steps, 20);
  EXPECT_EQ(chief.epochs, 2);
  EXPECT_GT(chief.validationAccuracy, 0.3);  // chance is 0.1
  EXPECT_EQ(chief.workersAlive, 1);
  EXPECT_EQ(chief.unitsDone, std::vector<int64_t>({6}));  // 3 units of 4 batches an epoch
  EXPECT_EQ(job.summaries[0].role, Role::Server);
  EXPECT_EQ(job.summaries[0].steps, 20);
  EXPECT_EQ(job.summaries[2].role, Role::Worker);
  EXPECT_EQ(job.summaries[2].steps, 20);  // its pushes
}

TEST_F(TrainParameterServer, StepsCountTheServersUpdates) {
  struct Case {
    Mode mode;
    int workers;
    int64_t epochs, steps;
    int64_t updates, epochsBegun;
  };
  // Async: a step is one push; sync with one worker: one round of one push.
  for (const Case& c : {Case{Mode::Async, 2, 0, 13, 13, 2}, Case{Mode::Sync, 1, 3, 25, 25, 3},
                        Case{Mode::Async, 1, 1, 40, 10, 1}}) {
    SCOPED_TRACE(std::string(modeName(c.mode)) + " steps " + std::to_string(c.steps));
    train::ParameterServerOptions options = syncOptions(c.epochs);
    options.mode = c.mode;
    options.steps = c.steps;
    const JobResult job = runJob(c.workers, train_, test_, options);
    EXPECT_EQ(job.summaries[1].steps, c.updates);
    EXPECT_EQ(job.summaries[1].epochs, c.epochsBegun);
    EXPECT_EQ(job.summaries[0].steps, c.updates);
  }
}

TEST_F(TrainParameterServer, AResumedJobEndsOnTheWeightsOfAStraightOne) {
  const JobResult straight = runJob(1, train_, test_, syncOptions(3));
  train::ParameterServerOptions first = syncOptions(3);
  first.steps = 20;  // two of the three epochs
  first.checkpointDir = dir_ + "/ck";
  first.checkpointEvery = 1;
  runJob(1, train_, test_, first);
  train::ParameterServerOptions rest = syncOptions(3);
  rest.resumeDir = dir_ + "/ck";
  const JobResult resumed = runJob(1, train_, test_, rest);
  EXPECT_EQ(resumed.summaries[1].steps, 30);
  EXPECT_EQ(resumed.chiefWeights, straight.chiefWeights);
}

// `batch` is the global batch, as fit's: two sync workers push 32 samples each a round, the
// epoch's 640 samples in 20 pushes (at 64 a push they would be 10), in at least one device's
// 10 steps (a round a worker sits out, waiting for a unit, adds one); a batch they cannot
// share is refused in the options' words.
TEST_F(TrainParameterServer, SyncWorkersShareTheGlobalBatch) {
  const JobResult job = runJob(2, train_, test_, syncOptions(1));
  EXPECT_EQ(job.summaries[2].steps + job.summaries[3].steps, 20);  // pushes of 32 samples
  EXPECT_GE(job.summaries[1].steps, 10);
  EXPECT_LT(job.summaries[1].steps, 20);
  train::ParameterServerOptions odd = syncOptions(1);
  odd.batch = 63;
  try {
    runJob(2, train_, test_, odd);
    FAIL() << "a global batch of 63 was split over 2 sync workers";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ParameterServerOptions::batch 63 does not split evenly "
                                         "over 2 workers"),
              std::string::npos)
        << e.what();
  }
}

// fit on one device checkpoints its first epoch's end (recorded as the second epoch's start);
// parameter servers resume there with the same global batch and end on the weights of two
// epochs on one device.
TEST_F(TrainParameterServer, ResumesFitsCheckpointAtAnEpochsEnd) {
  const std::string checkpoints = dir_ + "/one-device";
  oneDeviceWeights(train_, 1, checkpoints);
  const checkpoint::CheckpointManager manager(checkpoints, 1, false, [](const std::string&) {});
  const checkpoint::CheckpointContents written =
      checkpoint::CheckpointManager::read(manager.latestGood()->path);
  EXPECT_EQ(written.state.loader.epoch, 1);
  EXPECT_EQ(written.state.loader.batch, 0);
  train::ParameterServerOptions rest = syncOptions(2);
  rest.resumeDir = checkpoints;
  const JobResult resumed = runJob(1, train_, test_, rest);
  EXPECT_EQ(resumed.summaries[1].steps, 20);
  EXPECT_LT(maxRelativeDifference(resumed.chiefWeights, oneDeviceWeights(train_, 2)), 1e-6);
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
