// train::trainFederated in one process (the server here, one client host on a thread):
// FedAvg over clients of a synthetic set learns (accuracy well above chance after a few
// rounds), reports its rounds, bytes and per-round callbacks, calls the host's hook before
// every round it serves, refuses bad options by name (parallel::fed::checkOptions), and reads
// the options every trainer shares (RunOptions) in fit's words. A dataset that is not in
// memory (shards made when first read) trains the clients on their own samples, a batch at a
// time, to the same weights as the same samples in memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/sharded.h"
#include "kolo/train/federated.h"
#include "kolo/train/fit.h"

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
  using Change = std::function<void(parallel::fed::FederatedOptions&)>;
  for (const auto& [change, words] : std::vector<std::pair<Change, std::string>>{
           {[](auto& f) { f.clientsPerRound = 9; }, "FederatedOptions::clientsPerRound 9 is more than the 8 clients"},
           {[](auto& f) { f.rounds = 0; }, "FederatedOptions::rounds must be at least 1, got 0"},
           {[](auto& f) { f.client.proxMu = 0.1; }, "LocalTrainingOptions::proxMu applies to FedProx only"},
           {[](auto& f) { f.saThreshold = 2; }, "FederatedOptions::saThreshold applies to FederatedOptions::secureAgg only"},
           {[](auto& f) { f.dpNoise = 1.0; }, "FederatedOptions::dpNoise needs FederatedOptions::dpClip"},
           {[](auto& f) { f.simulatedDropRate = 1.5; }, "FederatedOptions::simulatedDropRate must lie in [0, 1], got 1.5"},
           {[](auto& f) { f.dpDelta = 1.0; }, "FederatedOptions::dpDelta must lie in (0, 1), got 1"}}) {
    FederatedTrainOptions o = options();
    change(o.federated);
    try {
      trainFederated(model, dataset(80, 1), nullptr, o);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
  // What the checks refuse alone, they accept together.
  FederatedTrainOptions o = options();
  o.federated.rounds = 1;
  o.federated.client.method = parallel::fed::Method::FedProx;
  o.federated.client.proxMu = 0.1;
  o.federated.secureAgg = true;
  o.federated.saThreshold = 2;
  o.federated.dpClip = 1.0;
  o.federated.dpNoise = 0.1;
  o.federated.simulatedDropRate = 1.0;
  EXPECT_EQ(trainFederated(model, dataset(80, 1), nullptr, o).rounds, 1);
}

// FederatedTrainOptions speaks fit's words: `steps` are the rounds, `seed` seeds the split and
// the rounds' clients, `statusFile` keeps the server's line (kolo status); what federated
// training does not read is refused by name, not ignored.
TEST(TrainFederatedTest, RunOptionsAreFitsWords) {
  observe::Logger logger(stderr, observe::LogLevel::Error);
  FederatedTrainOptions o = options();
  o.logger = &logger;
  o.federated.rounds = 1;  // the default: `steps` sets the rounds
  o.steps = 3;
  o.seed = 7;
  const std::string status = ::testing::TempDir() + "federated-status-" + std::to_string(::getpid());
  o.statusFile = status;
  const FederatedSummary summary = trainFederated(model, dataset(400, 1), dataset(100, 2), o);
  EXPECT_EQ(summary.rounds, 3);
  EXPECT_EQ(summary.steps, 3);
  const std::vector<RankStatusLine> lines = readRankStatus(status);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].state, "done");
  EXPECT_EQ(lines[0].step, 3);
  EXPECT_EQ(lines[0].totalSteps, 3);
  std::remove((status + ".rank-0").c_str());

  using Change = std::function<void(FederatedTrainOptions&)>;
  for (const auto& [change, words] : std::vector<std::pair<Change, std::string>>{
           {[](auto& f) {
              f.steps = 4;
              f.federated.rounds = 6;
            },
            "FederatedTrainOptions::steps 4 and FederatedOptions::rounds 6 disagree"},
           {[](auto& f) {
              f.seed = 3;
              f.federated.seed = 4;
            },
            "FederatedTrainOptions::seed 3 and FederatedOptions::seed 4 disagree"},
           {[](auto& f) { f.epochs = 2; }, "FederatedTrainOptions::epochs 2 is not read"},
           {[](auto& f) { f.batch = 64; }, "FederatedTrainOptions::batch 64 is not read"},
           {[](auto& f) { f.checkpointDir = "ck"; }, "FederatedTrainOptions::checkpointDir, checkpointEvery and "
                                                      "resumeDir are not available"},
           {[](auto& f) { f.steps = -1; }, "FederatedTrainOptions::steps must be at least 0, got -1"}}) {
    FederatedTrainOptions bad = options();
    change(bad);
    try {
      trainFederated(model, dataset(80, 1), nullptr, bad);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

// A sharded dataset whose shards are made when first gathered from, behind a guard that
// refuses any gather of more than `cap` samples: gathering the whole set into memory fails.
class CappedShards : public data::Dataset {
 public:
  static constexpr int64_t kShards = 8, kPerShard = 160;  // 1280 samples: more than kLabelChunk

  explicit CappedShards(int64_t cap) : cap_(cap) {
    data::ShardReader reader;
    reader.count = [](const std::string&) { return data::ShardInfo{.samples = kPerShard, .classes = 4}; };
    reader.open = [](const std::string& path) -> std::shared_ptr<const data::Dataset> {
      return shard(std::stoi(path.substr(path.find('-') + 1)));
    };
    std::vector<std::string> files;
    for (int s = 0; s < kShards; ++s) files.push_back("shard-" + std::to_string(s));
    shards_ = std::make_shared<data::ShardedDataset>(files, reader);
  }
  static std::shared_ptr<data::TensorDataset> shard(int s) {
    Generator gen(100 + static_cast<uint64_t>(s));
    Tensor inputs = Tensor::randn({kPerShard, 8}, gen);
    return std::make_shared<data::TensorDataset>(inputs, argmax(inputs.slice(1, 0, 4), 1));
  }
  /// The same samples, in memory.
  static std::shared_ptr<data::TensorDataset> whole() {
    std::vector<Tensor> inputs, labels;
    for (int s = 0; s < kShards; ++s) {
      inputs.push_back(shard(s)->inputs());
      labels.push_back(shard(s)->labels());
    }
    return std::make_shared<data::TensorDataset>(cat(inputs, 0), cat(labels, 0));
  }
  int64_t size() const override { return shards_->size(); }
  data::Batch gather(const std::vector<int64_t>& indices) const override {
    if (static_cast<int64_t>(indices.size()) > cap_)
      throw InvalidArgument("CappedShards: a gather of " + std::to_string(indices.size()) + " samples");
    int64_t seen = largest_.load();
    while (static_cast<int64_t>(indices.size()) > seen && !largest_.compare_exchange_weak(seen, indices.size())) {
    }
    return shards_->gather(indices);
  }
  int64_t largestGather() const { return largest_.load(); }

 private:
  int64_t cap_;
  std::shared_ptr<data::ShardedDataset> shards_;
  mutable std::atomic<int64_t> largest_{0};
};

TEST(TrainFederatedTest, ADatasetNotInMemoryIsReadAClientBatchAtATime) {
  observe::Logger logger(stderr, observe::LogLevel::Error);
  FederatedTrainOptions o = options();
  o.logger = &logger;
  o.federated.rounds = 3;
  const auto weights = [](const FederatedSummary& summary) {
    return parallel::fed::flattenState(*summary.model);
  };
  // Iid: nothing is read but each client's own batches of localBatch samples.
  const auto capped = std::make_shared<CappedShards>(o.federated.client.localBatch);
  const FederatedSummary sharded = trainFederated(model, capped, dataset(400, 2), o);
  EXPECT_EQ(capped->largestGather(), o.federated.client.localBatch);
  const FederatedSummary inMemory = trainFederated(model, CappedShards::whole(), dataset(400, 2), o);
  EXPECT_EQ(weights(sharded), weights(inMemory));
  EXPECT_GT(inMemory.validationAccuracy, 0.5) << "four classes: chance is 0.25";
  std::vector<int64_t> all(static_cast<size_t>(capped->size()));
  std::iota(all.begin(), all.end(), 0);
  EXPECT_THROW(capped->gather(all), InvalidArgument) << "the guard lets a gather of the whole set through";
  // A label-skewed split reads the labels, a chunk at a time.
  o.partition = parallel::fed::parsePartition("shards:2");
  const auto labelled = std::make_shared<CappedShards>(parallel::fed::kLabelChunk);
  EXPECT_EQ(weights(trainFederated(model, labelled, nullptr, o)),
            weights(trainFederated(model, CappedShards::whole(), nullptr, o)));
  EXPECT_EQ(labelled->largestGather(), parallel::fed::kLabelChunk);
}

}  // namespace
}  // namespace kolo::train
