// One parameter server's protocol at its edges: a worker whose connection drops leaves the
// sync rounds (the others go on), a round that waits too long names the missing worker, a
// wrong token or a client with another placement is refused, and values pulled by the chief
// are the server's.
#include <gtest/gtest.h>

#include <thread>

#include "kolo/error.h"
#include "ps_harness.h"

namespace kolo::parallel::ps::testing {
namespace {

std::unique_ptr<optim::Optimizer> sgd(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.1});
}

ClientOptions worker(int index) {
  return {ClientRole::Worker, index, Compression::None, kToken, std::chrono::seconds(30)};
}

/// Gradients of ones on every parameter of `model`.
void onesGradients(nn::Module& model) {
  for (auto& [name, p] : model.namedParameters()) {
    Tensor handle = p;
    handle.setGrad(Tensor::ones(p.shape()));
  }
}

TEST(ParameterServer, ALostWorkerLeavesTheSyncRounds) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 2, Mode::Sync, 0, placement, sgd);
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  {
    ServerGroup quitter(worker(1), placement, job.addresses());
    quitter.pull(params);
  }  // its connection closes without leaving
  ServerGroup group(worker(0), placement, job.addresses());
  int64_t version = group.pull(params);
  for (int step = 0; step < 3; ++step) {
    onesGradients(*model);
    version = group.pushPull(params, version);
  }
  EXPECT_EQ(version, 3);
  const ServerStats stats = job.server(0).stats();
  EXPECT_EQ(stats.workersLost, 1);
  EXPECT_EQ(stats.updates, 3);
  // Three SGD steps of lr 0.1 on gradients of ones.
  const Tensor first = makeMlp()->namedParameters()[0].second;
  EXPECT_NEAR(params[0].second.data<float>()[5], first.data<float>()[5] - 0.3f, 1e-6);
}

// A parameter the loss does not reach has no gradient: the push names it as the caller's
// mistake (a usage error), not a failed check.
TEST(ParameterServer, APushOfAParameterWithoutGradientNamesIt) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 1, Mode::Async, 0, placement, sgd);
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  ServerGroup group(worker(0), placement, job.addresses());
  const int64_t version = group.pull(params);
  onesGradients(*model);
  Tensor last = params.back().second;
  last.setGrad(Tensor());
  try {
    group.pushPull(params, version);
    ADD_FAILURE() << "a push without " << params.back().first << "'s gradient went through";
  } catch (const InternalError& e) {
    ADD_FAILURE() << "reported as a failed check: " << e.what();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(params.back().first + " has no gradient to push"), std::string::npos)
        << e.what();
  }
}

TEST(ParameterServer, ASyncRoundThatWaitsTooLongNamesTheMissingWorker) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 2, Mode::Sync, 0, placement, sgd, std::chrono::milliseconds(300));
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  ServerGroup group(worker(0), placement, job.addresses());
  group.pull(params);
  onesGradients(*model);
  try {
    group.pushPull(params, 0);
    FAIL() << "the round completed without worker 1";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter server 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("waited 300 ms for worker(s) 1"), std::string::npos)
        << e.what();
  }
}

TEST(ParameterServer, AWorkerTheChiefDropsLeavesTheRoundsAndIsRefused) {
  // Worker 1 keeps its connection open but sends nothing (a stopped process): the round
  // waits for it until the chief drops it, then goes on; a push it sends later is refused.
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 2, Mode::Sync, 0, placement, sgd);
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  ServerGroup silent(worker(1), placement, job.addresses());
  silent.pull(params);
  ServerGroup group(worker(0), placement, job.addresses());
  int64_t version = group.pull(params);
  onesGradients(*model);
  std::thread pusher([&] { version = group.pushPull(params, version); });
  ServerGroup chief({ClientRole::Chief, 0, Compression::None, kToken, std::chrono::seconds(30)},
                    placement, job.addresses());
  chief.drop(1);
  pusher.join();
  EXPECT_EQ(version, 1);
  EXPECT_EQ(job.server(0).stats().workersLost, 1);
  auto other = makeMlp();
  onesGradients(*other);
  EXPECT_THROW(silent.pushPull(other->namedParameters(), 0), PeerError);
  EXPECT_EQ(job.server(0).stats().updates, 1);
}

TEST(ParameterServer, RefusesAWrongTokenAndAnotherPlacement) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 1, Mode::Async, 0, placement, sgd);
  ClientOptions wrong = worker(0);
  wrong.token = "not-the-token";
  EXPECT_THROW(ServerGroup(wrong, placement, job.addresses()), PeerError);
  Placement other = placement;
  other.slices.pop_back();  // a client that places one parameter fewer there
  EXPECT_THROW(ServerGroup(worker(0), other, job.addresses()), Mismatch);
}

TEST(ParameterServer, TheChiefPullsTheServersValues) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 2, 1 << 20);
  ServerThreads job(2, 1, Mode::Async, 0, placement, sgd);
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  ServerGroup group(worker(0), placement, job.addresses());
  int64_t version = group.pull(params);
  onesGradients(*model);
  version = group.pushPull(params, version);
  auto chiefModel = makeMlp();
  ServerGroup chief({ClientRole::Chief, 0, Compression::None, kToken, std::chrono::seconds(30)},
                    placement, job.addresses());
  EXPECT_EQ(chief.pull(chiefModel->namedParameters()), 1);
  EXPECT_EQ(parallel::testing::flatValues(chiefModel->namedParameters()),
            parallel::testing::flatValues(params));
  std::vector<float> held = job.server(0).values();
  const std::vector<float> second = job.server(1).values();
  held.insert(held.end(), second.begin(), second.end());
  EXPECT_EQ(static_cast<int64_t>(held.size()), placement.elementsOf(0) + placement.elementsOf(1));
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
