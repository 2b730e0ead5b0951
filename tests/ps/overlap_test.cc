// A worker's exchange overlapped with its compute (WorkerExchange with two replicas): one
// overlapped worker is exactly SGD whose gradient arrives one step late (each step computes
// on the values from before its own previous update), three overlapped async workers still
// train the mlp, and a worker that stops between units holds the newest values.
#include <gtest/gtest.h>

#include "ps_harness.h"

namespace kolo::parallel::ps::testing {
namespace {

constexpr int64_t kBatch = 32;

std::unique_ptr<optim::Optimizer> sgd(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.05, .momentum = 0.6});
}

/// Without momentum: overlapped, three async workers push gradients about five updates old
/// (two without overlap), and staleness acts as momentum of its own.
std::unique_ptr<optim::Optimizer> plainSgd(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.05});
}

ClientOptions workerOptions(int w) {
  return {ClientRole::Worker, w, Compression::None, kToken, std::chrono::seconds(60)};
}

/// Trains one worker for `steps` batches through a WorkerExchange (overlapped or not, looking
/// ahead by `lookahead`) and returns the servers' final values; `stats` receives the server's
/// counters.
std::vector<double> trainOneWorker(bool overlapped, int steps, ServerStats* stats,
                                   double lookahead = 0.0) {
  const Samples data = firstSamples(steps * kBatch);
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 1, Mode::Async, 0, placement, sgd);
  std::vector<std::shared_ptr<nn::Module>> models = {makeMlp()};
  if (overlapped) models.push_back(makeMlp());
  std::vector<NamedTensors> replicas;
  for (const auto& model : models) replicas.push_back(model->namedParameters());
  ServerGroup group(workerOptions(0), placement, job.addresses());
  std::vector<double> values;
  {
    WorkerExchange exchange(group, replicas, lookahead);
    EXPECT_EQ(exchange.overlapped(), overlapped);
    exchange.pull();
    for (int k = 0; k < steps; ++k) {
      lossAndGradients(*models[static_cast<size_t>(exchange.current())], data, k * kBatch,
                       (k + 1) * kBatch);
      exchange.pushAndSwap();
    }
    exchange.settle();
    EXPECT_EQ(exchange.version(), steps);
    // After settle() the current replica holds the servers' newest values.
    auto model = makeMlp();
    ServerGroup chief({ClientRole::Chief, 0, Compression::None, kToken, std::chrono::seconds(60)},
                      placement, job.addresses());
    chief.pull(model->namedParameters());
    EXPECT_EQ(parallel::testing::flatValues(replicas[static_cast<size_t>(exchange.current())]),
              parallel::testing::flatValues(model->namedParameters()));
    *stats = chief.stats()[0];
    values = parallel::testing::flatValues(model->namedParameters());
  }
  group.leave();
  return values;
}

/// One device: theta_{k+1} = step(theta_k, gradient at theta_{k-1} on batch k), theta_{-1} =
/// theta_0 (the gradient of batch k computed on the weights before the previous update).
std::vector<double> trainOneDeviceOneStepLate(int steps) {
  const Samples data = firstSamples(steps * kBatch);
  auto model = makeMlp();
  auto previous = makeMlp();  // the weights one update back
  const NamedTensors params = model->namedParameters();
  const NamedTensors late = previous->namedParameters();
  auto optimizer = sgd(params);
  for (int k = 0; k < steps; ++k) {
    lossAndGradients(*previous, data, k * kBatch, (k + 1) * kBatch);
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i].second;
      p.setGrad(late[i].second.grad().clone());
      Tensor q = late[i].second;
      q.copyFrom(p);
    }
    optimizer->step();
  }
  return parallel::testing::flatValues(params);
}

/// One device whose gradient of batch k is computed at theta_{k-1} + a (theta_{k-1} -
/// theta_{k-2}) (theta_{-1} = theta_{-2} = theta_0): the late gradient at the point the
/// previous update's change, carried on, leads to.
std::vector<double> trainOneDeviceLateLookingAhead(int steps, float a) {
  const Samples data = firstSamples(steps * kBatch);
  auto model = makeMlp();
  auto probe = makeMlp();  // where the gradient is computed
  const NamedTensors params = model->namedParameters();
  const NamedTensors at = probe->namedParameters();
  auto optimizer = sgd(params);
  std::vector<std::vector<float>> previous, older;  // theta_{k-1}, theta_{k-2}
  for (const auto& [name, p] : params) previous.push_back(p.toFloatVector());
  older = previous;
  for (int k = 0; k < steps; ++k) {
    for (size_t i = 0; i < at.size(); ++i) {
      std::vector<float> point(previous[i].size());
      for (size_t j = 0; j < point.size(); ++j)
        point[j] = previous[i][j] + a * (previous[i][j] - older[i][j]);
      Tensor q = at[i].second;
      std::copy(point.begin(), point.end(), q.data<float>());
    }
    lossAndGradients(*probe, data, k * kBatch, (k + 1) * kBatch);
    older = previous;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i].second;
      previous[i] = p.toFloatVector();
      p.setGrad(at[i].second.grad().clone());
    }
    optimizer->step();
  }
  return parallel::testing::flatValues(params);
}

/// Test accuracy of `model` on training images [begin, end) (not trained on).
double heldOutAccuracy(nn::Module& model, const Samples& data, int64_t begin, int64_t end) {
  const Tensor logits = model.forward(data.x.slice(0, begin, end).contiguous());
  const std::vector<float> scores = logits.toFloatVector();
  const std::vector<double> labels = data.y.slice(0, begin, end).contiguous().toDoubleVector();
  const int64_t classes = logits.shape()[1];
  int64_t right = 0;
  for (int64_t row = 0; row < end - begin; ++row) {
    const float* s = scores.data() + row * classes;
    right += std::max_element(s, s + classes) - s == static_cast<int64_t>(labels[row]);
  }
  return static_cast<double>(right) / static_cast<double>(end - begin);
}

class Overlap : public ::testing::Test {
 protected:
  void SetUp() override { KOLO_SKIP_WITHOUT_FASHION_MNIST(); }
};

/// --ps-lookahead: one overlapped worker looking ahead by a computes each gradient at its
/// newest values carried on by a times their change since the reply before: exactly the one
/// device above (and not the plain one-step-late SGD).
TEST_F(Overlap, LookingAheadComputesWhereThePreviousChangeLeads) {
  constexpr int kSteps = 12;
  ServerStats stats;
  const std::vector<double> ahead = trainOneWorker(true, kSteps, &stats, 1.5);
  EXPECT_LT(parallel::testing::maxRelDiff(ahead, trainOneDeviceLateLookingAhead(kSteps, 1.5f)),
            1e-6);
  EXPECT_GT(parallel::testing::maxRelDiff(ahead, trainOneDeviceOneStepLate(kSteps)), 1e-4);
  // The version tags are the replies', so the staleness is the overlap's as before.
  EXPECT_EQ(stats.stalenessMax, 1);
}

TEST_F(Overlap, OneWorkerIsSgdWithItsGradientOneStepLate) {
  constexpr int kSteps = 12;
  ServerStats overlappedStats, inPlaceStats;
  const std::vector<double> overlapped = trainOneWorker(true, kSteps, &overlappedStats);
  const std::vector<double> inPlace = trainOneWorker(false, kSteps, &inPlaceStats);
  const std::vector<double> late = trainOneDeviceOneStepLate(kSteps);
  EXPECT_LT(parallel::testing::maxRelDiff(overlapped, late), 1e-6);
  // Not overlapped, the same worker is plain SGD, which the late run is not.
  EXPECT_GT(parallel::testing::maxRelDiff(inPlace, late), 1e-4);
  // Every gradient but the first was computed one update before the one it lands on.
  EXPECT_EQ(overlappedStats.stalenessMax, 1);
  EXPECT_EQ(overlappedStats.stalenessSum, kSteps - 1);
  EXPECT_EQ(inPlaceStats.stalenessMax, 0);
}

TEST_F(Overlap, ThreeAsyncWorkersStillTrain) {
  constexpr int kWorkers = 3;
  constexpr int kSteps = 150;
  const int64_t trained = kWorkers * kSteps * kBatch;  // 14,400 images
  const Samples data = firstSamples(trained + 2000);
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 2, 1 << 20);
  ServerThreads job(2, kWorkers, Mode::Async, 0, placement, plainSgd);
  parallel::testing::runThreads(kWorkers, [&](int w) {
    std::vector<std::shared_ptr<nn::Module>> models = {makeMlp(), makeMlp()};
    ServerGroup group(workerOptions(w), placement, job.addresses());
    WorkerExchange exchange(group, {models[0]->namedParameters(), models[1]->namedParameters()});
    exchange.pull();
    for (int k = 0; k < kSteps; ++k) {
      const int64_t begin = (k * kWorkers + w) * kBatch;
      lossAndGradients(*models[static_cast<size_t>(exchange.current())], data, begin,
                       begin + kBatch);
      exchange.pushAndSwap();
    }
    exchange.settle();
    group.leave();
  });
  auto model = makeMlp();
  const double before = heldOutAccuracy(*model, data, trained, trained + 2000);
  ServerGroup chief({ClientRole::Chief, 0, Compression::None, kToken, std::chrono::seconds(60)},
                    placement, job.addresses());
  EXPECT_EQ(chief.pull(model->namedParameters()), kWorkers * kSteps);
  const double after = heldOutAccuracy(*model, data, trained, trained + 2000);
  EXPECT_LT(before, 0.3);
  // What async training reaches depends on how the three workers interleave, which the
  // scheduler decides: 0.71-0.75 on an idle machine, 0.6975 seen under a load of 8; what this
  // test shows is that they train at all with their gradients several updates stale.
  EXPECT_GT(after, 0.6) << "from " << before;
  for (const ServerStats& s : chief.stats()) {
    EXPECT_EQ(s.pushes, kWorkers * kSteps);
    EXPECT_GE(s.stalenessMax, 2);
  }
}

TEST_F(Overlap, AnErrorOfTheExchangeThreadSurfacesInTheWorker) {
  const Samples data = firstSamples(kBatch);
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  auto job = std::make_unique<ServerThreads>(1, 1, Mode::Async, 0, placement, sgd);
  std::vector<std::shared_ptr<nn::Module>> models = {makeMlp(), makeMlp()};
  ServerGroup group({ClientRole::Worker, 0, Compression::None, kToken, std::chrono::seconds(10)},
                    placement, job->addresses());
  WorkerExchange exchange(group, {models[0]->namedParameters(), models[1]->namedParameters()});
  exchange.pull();
  job.reset();  // the server is gone: the exchange in flight fails
  lossAndGradients(*models[0], data, 0, kBatch);
  exchange.pushAndSwap();
  lossAndGradients(*models[1], data, 0, kBatch);
  EXPECT_THROW(exchange.pushAndSwap(), PeerError);
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
