// FedAvg against the exact methods it generalises: one client holding all the data with
// E = 1 and full participation is one-device SGD over the same batches; several IID clients
// with E = 1 and B = their whole data is FedSGD, i.e. full-batch gradient descent on the
// union of their data (the sample-weighted mean of the clients' mean gradients).
#include <gtest/gtest.h>

#include <numeric>

#include "federated/federated_harness.h"
#include "kolo/nn/batch_norm.h"
#include "kolo/ops.h"
#include "kolo/optim.h"

namespace kolo::parallel::fed {
namespace {

using testing::firstSamples;
using testing::makeMlp;
using testing::maxRelativeError;

void sgdStep(nn::Module& model, optim::Sgd& sgd, const data::TensorDataset& data,
             const std::vector<int64_t>& ids) {
  const data::Batch batch = data.gather(ids);
  sgd.zeroGrad();
  Tensor loss = crossEntropy(model.forward(batch.inputs), batch.labels);
  loss.backward();
  sgd.step();
}

TEST(FederatedEquivalence, OneClientWithAllDataEqualsOneDevice) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(600);
  std::vector<int64_t> all(600);
  std::iota(all.begin(), all.end(), 0);
  FederatedOptions options;
  options.clients = 1;
  options.clientsPerRound = 1;
  options.client.localEpochs = 1;
  options.client.localBatch = 50;
  options.client.lr = 0.05;
  options.seed = 3;
  testing::Job job(options, data, {all}, 1);
  for (int r = 0; r < 3; ++r) {
    const RoundReport report = job.round();
    EXPECT_EQ(report.clients, 1);
    EXPECT_EQ(report.dropped, 0);
  }
  job.stop();

  // One device: the same batches (the client's seeded order of each round), plain SGD.
  auto model = makeMlp();
  model->train(true);
  optim::Sgd sgd(model->namedParameters(), optim::SgdOptions{.lr = 0.05});
  LocalTrainingOptions client = options.client;
  client.seed = options.seed;
  for (int64_t round = 1; round <= 3; ++round) {
    const std::vector<int64_t> order = clientEpochOrder(all, client, round, 0, 0);
    EXPECT_NE(order, all);  // shuffled, and still the same batches
    for (size_t b = 0; b < order.size(); b += 50)
      sgdStep(*model, sgd, *data, std::vector<int64_t>(order.begin() + b, order.begin() + b + 50));
  }
  const std::vector<float> expected = flattenState(*model);
  EXPECT_LE(maxRelativeError(job.server().weights(), expected), 1e-5);
  EXPECT_GT(maxRelativeError(flattenState(*makeMlp()), expected), 1e-3);  // it trained
}

TEST(FederatedEquivalence, IidClientsWithWholeBatchEqualFedSgd) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(500);
  std::vector<int64_t> order(500);
  std::iota(order.begin(), order.end(), 0);
  Generator generator(11);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[generator.nextU64() % i]);
  // Unequal client sizes: 100, 150, 200 and 50 samples.
  std::vector<std::vector<int64_t>> partition;
  for (auto [begin, end] : {std::pair{0, 100}, {100, 250}, {250, 450}, {450, 500}})
    partition.emplace_back(order.begin() + begin, order.begin() + end);
  FederatedOptions options;
  options.clients = 4;
  options.clientsPerRound = 4;
  options.client.localEpochs = 1;
  options.client.localBatch = 0;
  options.client.lr = 0.1;
  testing::Job job(options, data, partition, 2);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(job.round().clients, 4);
  job.stop();

  auto model = makeMlp();
  model->train(true);
  optim::Sgd sgd(model->namedParameters(), optim::SgdOptions{.lr = 0.1});
  for (int step = 0; step < 2; ++step) sgdStep(*model, sgd, *data, order);
  EXPECT_LE(maxRelativeError(job.server().weights(), flattenState(*model)), 1e-5);
}

TEST(FederatedEquivalence, FedProxPullsTowardsTheGlobalModel) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(200);
  std::vector<int64_t> ids(200);
  std::iota(ids.begin(), ids.end(), 0);
  auto model = makeMlp();
  const std::vector<float> global = flattenState(*model);
  LocalTrainingOptions options;
  options.localEpochs = 3;
  options.localBatch = 20;
  options.lr = 0.1;
  auto norm = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s);
  };
  const double plain = norm(trainClient(*model, global, *data, ids, options, 1, 0));
  options.method = Method::FedProx;
  options.proxMu = 0.0;
  EXPECT_DOUBLE_EQ(norm(trainClient(*model, global, *data, ids, options, 1, 0)), plain);
  options.proxMu = 1.0;
  const double prox = norm(trainClient(*model, global, *data, ids, options, 1, 0));
  EXPECT_LT(prox, 0.9 * plain);
  options.dpClip = 0.01;
  EXPECT_NEAR(norm(trainClient(*model, global, *data, ids, options, 1, 0)), 0.01, 1e-6);
}

// Linear(784,32)-BatchNorm1d(32)-ReLU-Linear(32,10): a model with running statistics.
std::shared_ptr<nn::Module> makeBatchNormSmall() {
  Generator generator(9);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 32, generator), std::make_shared<nn::BatchNorm1d>(32),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 10, generator)});
}

// A batch norm's running statistics are state of the model, averaged like the weights: after
// a round the server's running mean and variance are the sample-weighted mean of the clients'
// (each continued from the global ones over the client's own batches), num_batches_tracked
// the weighted mean count, rounded; a few rounds evaluate well above chance in eval mode.
TEST(FederatedEquivalence, BatchNormStatisticsAreTheClientsSampleWeightedMean) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(1000);
  // Unequal client sizes: 100, 150, 200 and 50 samples, in batches of 50.
  std::vector<std::vector<int64_t>> partition;
  for (auto [begin, end] : {std::pair{0, 100}, {100, 250}, {250, 450}, {450, 500}}) {
    partition.emplace_back(end - begin);
    std::iota(partition.back().begin(), partition.back().end(), begin);
  }
  FederatedOptions options;
  options.clients = 4;
  options.clientsPerRound = 4;
  options.client.localBatch = 50;
  options.client.lr = 0.1;
  options.seed = 3;
  testing::Job job(options, data, partition, 2, {}, {}, makeBatchNormSmall);
  EXPECT_EQ(job.round().clients, 4);

  // Each client's local model after round 1, from the initial global state.
  const std::vector<float> global = flattenState(*makeBatchNormSmall());
  LocalTrainingOptions client = options.client;
  client.seed = options.seed;
  std::vector<double> mean, var;
  double weight = 0.0, batches = 0.0;
  for (int c = 0; c < 4; ++c) {
    auto local = makeBatchNormSmall();
    trainClient(*local, global, *data, partition[c], client, 1, c);
    const auto buffers =
        local->namedBuffers();  // 1.running_mean, 1.running_var, 1.num_batches_tracked
    const std::vector<float> m = buffers[0].second.toFloatVector(),
                             v = buffers[1].second.toFloatVector();
    const double w = static_cast<double>(partition[c].size());
    mean.resize(m.size());
    var.resize(v.size());
    for (size_t i = 0; i < m.size(); ++i) {
      mean[i] += w * m[i];
      var[i] += w * v[i];
    }
    batches += w * buffers[2].second.data<int64_t>()[0];
    weight += w;
  }
  auto server = makeBatchNormSmall();
  loadState(*server, job.server().weights());
  const auto buffers = server->namedBuffers();
  const std::vector<float> serverMean = buffers[0].second.toFloatVector();
  const std::vector<float> serverVar = buffers[1].second.toFloatVector();
  std::vector<float> expectedMean, expectedVar;
  for (size_t i = 0; i < mean.size(); ++i) {
    expectedMean.push_back(static_cast<float>(mean[i] / weight));
    expectedVar.push_back(static_cast<float>(var[i] / weight));
  }
  // The server adds the weighted mean change to the global state in f32: a rounding apart.
  EXPECT_LE(maxRelativeError(serverMean, expectedMean), 1e-6);
  EXPECT_LE(maxRelativeError(serverVar, expectedVar), 1e-6);
  EXPECT_GT(maxRelativeError(serverMean, std::vector<float>(32, 0.0f)), 1e-2);  // they moved
  // 2, 3, 4 and 1 batches weighted by 100, 150, 200 and 50 samples: 3.
  EXPECT_EQ(batches / weight, 3.0);
  EXPECT_EQ(buffers[2].second.data<int64_t>()[0], 3);

  for (int r = 0; r < 4; ++r) job.round();
  job.stop();
  loadState(*server, job.server().weights());
  server->train(false);
  const data::Batch heldOut = data->gather([] {
    std::vector<int64_t> ids(500);
    std::iota(ids.begin(), ids.end(), 500);
    return ids;
  }());
  const std::vector<float> predicted = argmax(server->forward(heldOut.inputs), 1).toFloatVector();
  const std::vector<float> labels = heldOut.labels.toFloatVector();
  int correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
  EXPECT_GT(correct / 500.0, 0.5);  // chance is 0.1
}

}  // namespace
}  // namespace kolo::parallel::fed
