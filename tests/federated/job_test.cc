// Federated jobs over a store (server on the test's thread, client hosts on threads): a
// silent host's clients time out and the round completes with the rest, weighted exactly;
// random drop-outs; bad updates (wrong shape, NaN, stale round) are refused and named while
// the round goes on; secure aggregation with 30% dropping gives the plain FedAvg result;
// DP-FedAvg without noise is the unweighted mean of clipped updates and reports epsilon.
#include <gtest/gtest.h>

#include <numeric>

#include "federated/federated_harness.h"

namespace kolo::parallel::fed {
namespace {

using testing::firstSamples;
using testing::Job;
using testing::makeSmall;

const testing::ModelFactory kSmall = [] { return makeSmall(); };
using testing::maxRelativeError;

std::vector<std::vector<int64_t>> iid(int64_t n, int clients) {
  return partitionClients(firstSamples(n)->labels(), clients, parsePartition("iid"), 1);
}

FederatedOptions smallJob(int clients, int perRound) {
  FederatedOptions options;
  options.clients = clients;
  options.clientsPerRound = perRound;
  options.client.localEpochs = 1;
  options.client.localBatch = 0;
  options.client.lr = 0.1;
  options.seed = 5;
  return options;
}

// The server's weights after one round in which exactly `clients` answered.
std::vector<float> expectedAfterOneRound(const FederatedOptions& options,
                                         const data::TensorDataset& data,
                                         const std::vector<std::vector<int64_t>>& partition,
                                         const std::vector<int>& clients) {
  auto model = makeSmall();
  const std::vector<float> global = flattenState(*model);
  LocalTrainingOptions client = options.client;
  client.seed = options.seed;
  client.dpClip = options.dpClip;
  Aggregator aggregator(1, global.size());
  for (int c : clients) {
    Update u{1, c, static_cast<int64_t>(partition[c].size()),
             trainClient(*model, global, data, partition[c], client, 1, c)};
    if (options.dpClip > 0) {
      aggregator.addUnweighted(u);
    } else {
      aggregator.add(u);
    }
  }
  std::vector<float> out = global;
  const double denominator = options.dpClip > 0 ? options.clientsPerRound : aggregator.weight();
  for (size_t i = 0; i < out.size(); ++i)
    out[i] += static_cast<float>(aggregator.sum()[i] / denominator);
  return out;
}

TEST(FederatedJob, SilentHostTimesOutAndTheRoundCompletesWithTheRest) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(600);
  const auto partition = iid(600, 6);
  FederatedOptions options = smallJob(6, 6);
  // The silent host costs the whole timeout; the other host must make it on a loaded machine.
  options.roundTimeout = std::chrono::seconds(5);
  Job job(options, data, partition, 2, /*silent=*/{1}, {},
          kSmall);  // host 1 (clients 1, 3, 5) never answers
  const RoundReport report = job.round();
  EXPECT_EQ(report.clients, 3);
  EXPECT_EQ(report.dropped, 3);
  EXPECT_TRUE(report.refused.empty());
  job.stop();
  EXPECT_LE(maxRelativeError(job.server().weights(),
                             expectedAfterOneRound(options, *data, partition, {0, 2, 4})),
            1e-6);
}

TEST(FederatedJob, RandomDropOutsAreLeftOut) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(1000);
  FederatedOptions options = smallJob(20, 10);
  options.simulatedDropRate = 0.3;
  // Dropping clients say so at once: the timeout is only there for a host that is late.
  options.roundTimeout = std::chrono::seconds(60);
  Job job(options, data, iid(1000, 20), 2, {}, {}, kSmall);
  int dropped = 0;
  for (int r = 0; r < 2; ++r) {
    const RoundReport report = job.round();
    EXPECT_EQ(report.clients + report.dropped, 10);
    EXPECT_GT(report.clients, 0);
    dropped += report.dropped;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 20);
}

TEST(FederatedJob, BadUpdatesAreRefusedAndNamedAndTheRoundGoesOn) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(400);
  const auto partition = iid(400, 4);
  const FederatedOptions options = smallJob(4, 4);
  auto tamper = [](ClientHost& host) {
    host.setUpdateTransform([](Update& u) {
      if (u.client == 1) u.delta.resize(10);   // wrong shape
      if (u.client == 2) u.delta[1234] = NAN;  // NaN
      if (u.client == 3) u.round -= 1;         // stale round number
    });
  };
  Job job(options, data, partition, 1, {}, tamper, kSmall);
  const RoundReport report = job.round();
  EXPECT_EQ(report.clients, 1);
  EXPECT_EQ(report.dropped, 3);
  ASSERT_EQ(report.refused.size(), 3u);
  EXPECT_NE(report.refused[0].find("client 1 sent an update of 10 values"), std::string::npos)
      << report.refused[0];
  EXPECT_NE(report.refused[1].find("client 2 sent a non-finite value (nan) at element 1234"),
            std::string::npos)
      << report.refused[1];
  EXPECT_NE(report.refused[2].find("client 3 sent an update for round 0 in round 1 (stale)"),
            std::string::npos)
      << report.refused[2];
  job.stop();
  EXPECT_LE(maxRelativeError(job.server().weights(),
                             expectedAfterOneRound(options, *data, partition, {0})),
            1e-6);
}

TEST(FederatedJob, SecureAggregationWithThirtyPercentDroppingEqualsPlainFedAvg) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(500);
  const auto partition = partitionClients(data->labels(), 10, parsePartition("dirichlet:1"), 2);
  FederatedOptions options = smallJob(10, 10);
  options.simulatedDropRate = 0.3;
  // Dropping clients say so at once: the timeout is only there for a host that is late.
  options.roundTimeout = std::chrono::seconds(60);
  std::vector<float> plainWeights;
  RoundReport plain;
  {
    Job job(options, data, partition, 2, {}, {}, kSmall);
    plain = job.round();
    job.stop();
    plainWeights = job.server().weights();
  }
  ASSERT_GT(plain.dropped, 0);
  ASSERT_GE(plain.clients, 6);  // the default threshold, a majority of 10
  options.secureAgg = true;
  Job job(options, data, partition, 2, {}, {}, kSmall);
  const RoundReport secure = job.round();
  EXPECT_EQ(secure.clients, plain.clients);
  EXPECT_EQ(secure.dropped, plain.dropped);
  EXPECT_TRUE(secure.refused.empty()) << secure.refused.front();
  job.stop();
  // The same clients' weighted mean; only the 2^-24 fixed point differs.
  EXPECT_LE(maxRelativeError(job.server().weights(), plainWeights), 1e-6);
  EXPECT_GT(maxRelativeError(job.server().weights(), flattenState(*makeSmall())), 1e-4);
  EXPECT_GT(secure.bytesUp, plain.bytesUp);  // u64 words and the protocol's keys and shares
}

TEST(FederatedJob, DpFedAvgClipsAveragesOverKAndReportsEpsilon) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  auto data = firstSamples(400);
  const auto partition = iid(400, 8);
  FederatedOptions options = smallJob(8, 4);
  options.dpClip = 0.05;
  options.dpNoise = 0.0;
  Job job(options, data, partition, 2, {}, {}, kSmall);
  const RoundReport report = job.round();
  EXPECT_TRUE(std::isinf(report.epsilon));  // no noise: no privacy
  job.stop();
  EXPECT_LE(maxRelativeError(job.server().weights(),
                             expectedAfterOneRound(options, *data, partition,
                                                   sampleClients(8, 4, 1, options.seed))),
            1e-6);

  options.dpNoise = 1.0;
  Job noisy(options, data, partition, 2, {}, {}, kSmall);
  const RoundReport first = noisy.round();
  EXPECT_TRUE(std::isfinite(first.epsilon));
  EXPECT_GT(first.epsilon, 0.0);
  // The server's weights less the noiseless mean: Gaussian noise of std sigma * clip / K.
  const std::vector<float> clean =
      expectedAfterOneRound(options, *data, partition, sampleClients(8, 4, 1, options.seed));
  double sum = 0, squares = 0;
  const std::vector<float>& noised = noisy.server().weights();
  for (size_t i = 0; i < clean.size(); ++i) {
    const double d = double(noised[i]) - clean[i];
    sum += d;
    squares += d * d;
  }
  const double n = static_cast<double>(clean.size());
  EXPECT_NEAR(sum / n, 0.0, 0.05 * 0.05 / 4);
  EXPECT_NEAR(std::sqrt(squares / n), 1.0 * 0.05 / 4, 0.05 * 0.0125);
  EXPECT_GT(noisy.round().epsilon, first.epsilon);
}

}  // namespace
}  // namespace kolo::parallel::fed
