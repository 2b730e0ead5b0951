// train::ParameterServerState: the servers' state saved by train::save is a checkpoint like
// every strategy's (whole weights, whole optimizer state), and train::load restores it into
// servers of another count and placement so exactly that the next update lands on the same
// values as on the servers that saved it. Servers and clients are threads of the test over
// loopback sockets.
#include <gtest/gtest.h>

#include <filesystem>

#include "kolo/checkpoint.h"
#include "kolo/train/parameter_server.h"
#include "ps_harness.h"
#include "launcher/process_helpers.h"

namespace kolo::parallel::ps::testing {
namespace {

constexpr int64_t kShardBytes = 64 * 1024;  // the mlp's largest weights split over servers

OptimizerFactory sgdMomentum() {
  return [](const NamedTensors& slices) {
    return std::make_unique<optim::Sgd>(slices, optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  };
}

OptimizerFactory adam() {
  return [](const NamedTensors& slices) {
    return std::make_unique<optim::Adam>(slices, optim::AdamOptions{.lr = 1e-3});
  };
}

/// A job's servers on threads, a worker's and the chief's connections, and the model each
/// side computes on.
struct Job {
  Job(int servers, const OptimizerFactory& optimizer)
      : placement(placeParameters(makeMlp()->namedParameters(), servers, kShardBytes)),
        threads(servers, 1, Mode::Async, 2, placement, optimizer),
        worker(ClientOptions{ClientRole::Worker, 0, Compression::None, kToken}, placement,
               threads.addresses()),
        chief(std::make_shared<ServerGroup>(
            ClientOptions{ClientRole::Chief, 0, Compression::None, kToken}, placement,
            threads.addresses())),
        workerModel(makeMlp()),
        chiefModel(makeMlp()) {}

  /// One push of the gradient of rows [begin, end), computed on the servers' newest values.
  void step(const Samples& data, int64_t begin, int64_t end) {
    const NamedTensors parameters = workerModel->namedParameters();
    const int64_t version = worker.pull(parameters);
    lossAndGradients(*workerModel, data, begin, end);
    worker.pushPull(parameters, version);
  }

  /// The servers' values, flat, in the model's parameter order.
  std::vector<float> values() {
    const NamedTensors parameters = chiefModel->namedParameters();
    chief->pull(parameters);
    std::vector<float> flat;
    for (const auto& [name, p] : parameters) {
      const std::vector<float> v = p.toFloatVector();
      flat.insert(flat.end(), v.begin(), v.end());
    }
    return flat;
  }

  Placement placement;
  ServerThreads threads;
  ServerGroup worker;
  std::shared_ptr<ServerGroup> chief;
  std::shared_ptr<nn::Module> workerModel, chiefModel;
};

class ParameterServerStateTest : public kolo::testing::TempDirTest {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    TempDirTest::SetUp();
  }

  /// Three updates on two servers, saved; restored into `servers` servers; one more update
  /// on each side must give the same values bit for bit.
  void roundTrip(const OptimizerFactory& optimizer, int servers, const std::string& kind,
                 const std::string& slot) {
    const Samples data = firstSamples(256);
    Job saved(2, optimizer);
    for (int64_t s = 0; s < 3; ++s) saved.step(data, 64 * s, 64 * (s + 1));
    train::ParameterServerState state(saved.chief, saved.chiefModel->namedParameters(), dir_);
    const train::CheckpointOptions options{.directory = dir_ + "/ck"};
    const std::string path = train::save({&state}, {.step = 3, .loader = {1, 0}}, options);
    EXPECT_EQ(state.version(), 3);

    // A checkpoint like every strategy's: whole weights (the servers' values) and the whole
    // optimizer state, with the staging files gone.
    const checkpoint::CheckpointContents contents = checkpoint::CheckpointManager::read(path);
    EXPECT_EQ(contents.optimizerKind, kind);
    EXPECT_EQ(contents.optimizerScalars.at("step"), 3.0);
    EXPECT_EQ(contents.state.extra.at("ps_version"), "3");
    std::vector<float> written;
    for (const auto& [name, tensor] : contents.weights) {
      const std::vector<float> v = tensor.toFloatVector();
      written.insert(written.end(), v.begin(), v.end());
    }
    EXPECT_EQ(written, saved.values());
    const auto parameters = saved.chiefModel->namedParameters();
    for (const auto& [name, p] : parameters) {
      bool found = false;
      for (const auto& [key, tensor] : contents.optimizerTensors)
        if (key == name + "/" + slot) found = tensor.shape() == p.shape();
      EXPECT_TRUE(found) << "no whole " << slot << " of " << name;
    }
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      EXPECT_EQ(entry.path().filename().string().rfind(".ps-state", 0), std::string::npos)
          << entry.path();

    Job restored(servers, optimizer);
    train::ParameterServerState target(restored.chief, restored.chiefModel->namedParameters(),
                                       dir_);
    const train::Position position = train::load({&target}, options);
    EXPECT_EQ(position.step, 3);
    EXPECT_EQ(position.loader.epoch, 1);
    EXPECT_EQ(target.version(), 3);
    EXPECT_EQ(restored.values(), saved.values());
    // The optimizer state came along: the next update is the same on both.
    saved.step(data, 192, 256);
    restored.step(data, 192, 256);
    EXPECT_EQ(restored.values(), saved.values());
    EXPECT_EQ(restored.threads.server(0).stats().updates, 4);
  }
};

TEST_F(ParameterServerStateTest, SgdMomentumRoundTripsIntoThreeServers) {
  roundTrip(sgdMomentum(), 3, "sgd", "momentum_buffer");
}

TEST_F(ParameterServerStateTest, AdamRoundTripsIntoOneServer) {
  roundTrip(adam(), 1, "adam", "exp_avg_sq");
}

TEST_F(ParameterServerStateTest, LoadRefusesAnotherModelsCheckpoint) {
  Job job(1, sgdMomentum());
  train::ParameterServerState state(job.chief, job.chiefModel->namedParameters(), dir_);
  // A checkpoint of another model: its weights have other names.
  train::StateDict other;
  other.weights = {{"encoder.weight", Tensor::zeros({4, 4})}};
  other.optimizerKind = "sgd";
  EXPECT_THROW(state.loadStateDict(other), Mismatch);
  other.optimizerKind.clear();
  EXPECT_THROW(state.loadStateDict(other), Mismatch);
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
