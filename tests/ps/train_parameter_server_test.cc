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
#include "kolo/nn/batch_norm.h"
#include "kolo/nn/layers.h"
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

/// What the roles of one job returned, the weights the chief's model ended with, and every
/// role's model (server, chief, worker 0, 1, ...).
struct JobResult {
  std::vector<train::ParameterServerSummary> summaries;  // server, chief, worker 0, 1, ...
  std::vector<float> chiefWeights;
  std::vector<std::shared_ptr<nn::Module>> models;
};

/// Linear(784, 32), BatchNorm1d(32), ReLU, Linear(32, 10): a model with running statistics.
std::shared_ptr<nn::Module> makeBatchNormMlp() {
  Generator gen(4321);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(784, 32, gen));
  model->add(std::make_shared<nn::BatchNorm1d>(32));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(32, 10, gen));
  return model;
}

/// The model's parameters and buffers in state_dict order, as floats.
std::vector<float> flatState(const nn::Module& model) {
  std::vector<float> flat;
  for (const auto& [name, t] : model.stateDict()) {
    const std::vector<float> v = t.toFloatVector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

/// One job of 1 server, the chief and `workers` workers, each a thread calling
/// trainParameterServer with its role, through a store of the test's own.
JobResult runJob(int workers, std::shared_ptr<const data::Dataset> train,
                 std::shared_ptr<const data::Dataset> validation,
                 train::ParameterServerOptions options, const ModelFactory& makeModel = makeMlp,
                 const train::ParameterServerCallbacks& callbacks = {}) {
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
            [&built, &makeModel, r] { return built[r] = makeModel(); }, sgdMomentum(), train,
            roles[r].role == Role::Chief ? validation : nullptr, mine, callbacks);
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
  result.models = built;
  return result;
}

/// Weights of the mlp after `epochs` epochs of train::fit on one device, global batch 64,
/// checkpointed into `checkpointDir` at the end ("" : not).
std::vector<float> oneDeviceWeights(std::shared_ptr<const data::Dataset> train, int64_t epochs,
                                    const std::string& checkpointDir = "",
                                    std::vector<float>* state = nullptr,
                                    const ModelFactory& makeModel = makeMlp) {
  train::DataParallelOptions single;
  single.strategy.kind = StrategyKind::OneDevice;
  train::DataParallelEngine engine(makeModel, sgdMomentum(), single);
  observe::Logger quiet(stderr, observe::LogLevel::Warn);
  train::FitOptions options;
  options.epochs = epochs;
  options.batch = 64;
  options.quiet = true;
  options.logger = &quiet;
  options.checkpointDir = checkpointDir;
  train::fit(engine, train, nullptr, options);
  if (state) *state = flatState(engine.model());
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
// epoch's 640 samples in 20 pushes (at 64 a push they would be 10), in one device's 10 steps
// exactly: the units (4 batches, then the epoch's last 2 and 2) go to the workers two alike
// at a time, so no worker pushes rounds alone while the other waits for a unit (12 steps
// before). A run that `steps` cuts short mid-epoch (13 of 20) takes its steps exactly too. A
// batch they cannot share is refused in the options' words.
TEST_F(TrainParameterServer, SyncWorkersShareTheGlobalBatch) {
  const JobResult job = runJob(2, train_, test_, syncOptions(1));
  EXPECT_EQ(job.summaries[2].steps, 10);  // pushes of 32 samples
  EXPECT_EQ(job.summaries[3].steps, 10);
  EXPECT_EQ(job.summaries[1].steps, 10);
  EXPECT_EQ(job.summaries[0].steps, 10);
  train::ParameterServerOptions cut = syncOptions(2);
  cut.steps = 13;
  const JobResult shorter = runJob(2, train_, test_, cut);
  EXPECT_EQ(shorter.summaries[1].steps, 13);
  EXPECT_EQ(shorter.summaries[2].steps, 13);
  EXPECT_EQ(shorter.summaries[3].steps, 13);
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

// A batch norm's running statistics are the model's state: the workers keep theirs, the
// chief's model takes their mean (num_batches_tracked: their sum). One sync worker normalises
// the batches one device does, so the chief ends on one device's state, running statistics
// included; two workers' job ends with the chief holding exactly the mean of the workers'
// statistics and evaluates well above chance; a resumed job ends on a straight one's state.
TEST_F(TrainParameterServer, BatchNormsRunningStatisticsAreTheWorkersMean) {
  const JobResult one = runJob(1, train_, test_, syncOptions(2), makeBatchNormMlp);
  std::vector<float> reference;
  oneDeviceWeights(train_, 2, "", &reference, makeBatchNormMlp);
  const std::vector<float> chief = flatState(*one.models[1]);
  ASSERT_EQ(chief.size(), reference.size());
  EXPECT_LT(maxRelativeDifference(chief, reference), 1e-6);
  const Tensor trackedOne = one.models[1]->namedBuffers()[2].second;
  EXPECT_EQ(trackedOne.toFloatVector(), std::vector<float>{20.0f});  // 2 epochs of 10 batches
  // Not vacuous: the running statistics moved from their initial zeros and ones.
  EXPECT_NE(one.models[1]->namedBuffers()[0].second.toFloatVector(), std::vector<float>(32, 0.0f));

  const JobResult two = runJob(2, train_, test_, syncOptions(2), makeBatchNormMlp);
  const auto chiefBuffers = two.models[1]->namedBuffers();
  const auto first = two.models[2]->namedBuffers(), second = two.models[3]->namedBuffers();
  ASSERT_EQ(chiefBuffers.size(), 3u);
  for (size_t b = 0; b < 2; ++b) {  // running_mean, running_var
    SCOPED_TRACE(chiefBuffers[b].first);
    const std::vector<float> a = first[b].second.toFloatVector(),
                             c = second[b].second.toFloatVector();
    std::vector<float> mean(a.size());
    for (size_t i = 0; i < a.size(); ++i)
      mean[i] = static_cast<float>((static_cast<double>(a[i]) + c[i]) / 2.0);
    EXPECT_EQ(chiefBuffers[b].second.toFloatVector(), mean);
    EXPECT_NE(a, c);  // each worker normalised batches of its own
  }
  const int64_t batchesFirst = first[2].second.data<int64_t>()[0];
  const int64_t batchesSecond = second[2].second.data<int64_t>()[0];
  EXPECT_EQ(batchesFirst + batchesSecond, 40);  // 2 epochs of 20 pushes of 32 samples
  EXPECT_EQ(chiefBuffers[2].second.data<int64_t>()[0], 40);
  EXPECT_GT(two.summaries[1].validationAccuracy, 0.5);  // chance is 0.1

  train::ParameterServerOptions first2 = syncOptions(2);
  first2.steps = 10;
  first2.checkpointDir = dir_ + "/bn";
  first2.checkpointEvery = 1;
  runJob(1, train_, test_, first2, makeBatchNormMlp);
  train::ParameterServerOptions rest = syncOptions(2);
  rest.resumeDir = dir_ + "/bn";
  const JobResult resumed = runJob(1, train_, test_, rest, makeBatchNormMlp);
  EXPECT_EQ(flatState(*resumed.models[1]), flatState(*one.models[1]));
}

// Every role keeps a status line as fit's ranks do (kolo status), at its place in the launch
// order: the server (0) "serving" with its updates, the chief (1) "dispatching", the workers
// (2, 3) "training" with their pushes while the job runs; each "done" at the end, with the
// epoch, its steps and a loss.
TEST_F(TrainParameterServer, EveryRoleKeepsAStatusLine) {
  const std::string status = dir_ + "/status";
  train::ParameterServerOptions options = syncOptions(2);
  options.statusFile = status;
  std::vector<train::RankStatusLine> during;
  train::ParameterServerCallbacks callbacks;
  callbacks.beforePush = [&](const train::WorkerPush& push) {
    if (push.worker == 0 && push.push == 6) during = train::readRankStatus(status);
  };
  const JobResult job = runJob(2, train_, test_, options, makeMlp, callbacks);
  ASSERT_EQ(during.size(), 4u);
  EXPECT_EQ(during[0].state, "serving");
  EXPECT_TRUE(during[1].state == "dispatching" || during[1].state == "evaluating") << during[1].state;
  EXPECT_EQ(during[2].state, "training");
  EXPECT_GE(during[2].step, 1);
  // Only the workers are compared for a straggler: the server and the chief count otherwise.
  EXPECT_TRUE(train::findStraggler(during).rank < 0 || train::findStraggler(during).rank >= 2);
  const std::vector<train::RankStatusLine> after = train::readRankStatus(status);
  ASSERT_EQ(after.size(), 4u);
  const std::vector<int64_t> steps = {job.summaries[0].steps, job.summaries[1].steps, job.summaries[2].steps,
                                      job.summaries[3].steps};
  for (size_t r = 0; r < 4; ++r) {
    SCOPED_TRACE("launch rank " + std::to_string(r));
    EXPECT_EQ(after[r].rank, static_cast<int>(r));
    EXPECT_EQ(after[r].state, "done");
    EXPECT_EQ(after[r].step, steps[r]);
    EXPECT_EQ(after[r].totalSteps, 20);
    EXPECT_EQ(after[r].epoch, 2);
    if (r > 0) {
      EXPECT_GT(after[r].loss, 0.0);
    }
  }
  EXPECT_EQ(after[0].step, job.summaries[1].steps);  // the servers' updates, as the chief saw them
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
