// train::trainFederated in one process (the server here, one client host on a thread):
// FedAvg over clients of a synthetic set learns (accuracy well above chance after a few
// rounds), reports its rounds, bytes and per-round callbacks, calls the host's hook before
// every round it serves, and refuses bad options by name.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/train/federated.h"

namespace kolo::train {
namespace {

std::shared_ptr<data::TensorDataset> dataset(int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor inputs = Tensor::randn({n, 8}, gen);
  return std::make_shared<data::TensorDataset>(inputs, argmax(inputs.slice(1, 0, 4), 1));
}

std::shared_ptr<nn::Module> model() {
  Generator gen(5);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 32, gen), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 4, gen)});
}

FederatedTrainOptions options() {
  FederatedTrainOptions o;
  o.federated.clients = 8;
  o.federated.clientsPerRound = 4;
  o.federated.rounds = 6;
  o.federated.client.lr = 0.1;
  o.federated.client.localBatch = 16;
  o.federated.client.localEpochs = 2;
  o.quiet = true;
  return o;
}

TEST(TrainFederatedTest, OneProcessLearnsAndReportsEveryRound) {
  observe::Logger logger(stderr, observe::LogLevel::Error);
  FederatedTrainOptions o = options();
  o.logger = &logger;
  int rounds = 0, served = 0;
  FederatedCallbacks callbacks;
  callbacks.onRoundEnd = [&](const FederatedRoundEnd& end) {
    ++rounds;
    EXPECT_EQ(end.report.round, rounds);
    EXPECT_EQ(end.report.clients, 4);
  };
  callbacks.beforeRound = [&](int64_t) { ++served; };
  const FederatedSummary summary = trainFederated(model, dataset(800, 1), dataset(400, 2), o, callbacks);
  EXPECT_TRUE(summary.server);
  EXPECT_EQ(summary.rounds, 6);
  EXPECT_EQ(rounds, 6);
  EXPECT_GE(served, 6);  // and once more to learn that the job is over
  EXPECT_GT(summary.bytesUp, 0);
  EXPECT_GT(summary.validationAccuracy, 0.6) << "four classes: chance is 0.25";
  ASSERT_NE(summary.model, nullptr);
}

TEST(TrainFederatedTest, BadOptionsAreNamed) {
  FederatedTrainOptions o = options();
  o.federated.clientsPerRound = 9;
  try {
    trainFederated(model, dataset(80, 1), nullptr, o);
    FAIL() << "9 clients per round of 8 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("9 clients per round of 8 clients"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolo::train
