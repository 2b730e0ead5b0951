// The train layer in-process: fit over a DataParallelEngine on ranks as threads takes the
// steps of one device (weights to float tolerance, with a check that training moved them);
// a run resumed from a checkpoint ends bit-identical to a straight one; evaluate() splits
// the work over the ranks and returns the figures of one process; save() keeps each
// Stateful object's sections and refuses two objects that claim one name; the metrics lines
// keep the schema `kolo report` reads, with what onEnd adds to the final line; every rank
// learns every rank's figures; accumulated micro-batches take the whole batch's steps with
// one gradient exchange a step; evaluate() counts each position of a sequence (its default loss
// too); a requeued Slurm job resumes from its checkpoint directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kolo/checkpoint.h"
#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/train/fit.h"
#include "kolo/train/report.h"
#include "parallel/native_ranks.h"
#include "parallel/toy_setup.h"
#include "train/train_fixtures.h"

namespace kolo::train {
namespace {

namespace fs = std::filesystem;
using parallel::testing::nativeRanks;
using parallel::testing::runThreads;
using testing::maxAbsDiff;
using testing::sgd;
using testing::weights;

constexpr int64_t kFeatures = 12;
constexpr int64_t kClasses = 5;

std::shared_ptr<data::TensorDataset> dataset(int64_t n, uint64_t seed) {
  return testing::linearDataset(n, seed, kFeatures, kClasses);
}

std::shared_ptr<nn::Module> model() {
  Generator gen(3);
  return std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(kFeatures, 32, gen), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(32, kClasses, gen)});
}

// An engine of `kind` over `comm` (null: one device).
std::unique_ptr<DataParallelEngine> engine(std::shared_ptr<comm::Communicator> comm) {
  DataParallelOptions options;
  options.strategy.kind = comm ? parallel::StrategyKind::MultiWorkerMirrored
                               : parallel::StrategyKind::OneDevice;
  options.strategy.communicator = std::move(comm);
  return std::make_unique<DataParallelEngine>(model, sgd, options);
}

FitOptions quietOptions(observe::Logger& logger) {
  FitOptions options;
  options.batch = 32;
  options.seed = 5;
  options.quiet = true;
  options.logger = &logger;
  options.prefetch = 0;
  options.schedule = [](int64_t total, int64_t) {
    return std::make_unique<optim::CosineLr>(0.1, total);
  };
  return options;
}

std::string freshDir(const std::string& name) { return testing::freshDir("kolo_train_test", name); }

// Trains `steps` steps on `ranks` thread ranks (0: one device) and returns rank 0's
// weights; `change` edits the options first.
std::vector<float> trainOn(int ranks, int64_t steps,
                           const std::function<void(FitOptions&)>& change = nullptr,
                           const FitCallbacks& callbacks = {}) {
  const auto train = dataset(512, 1);
  const auto test = dataset(128, 2);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  std::vector<float> result;
  auto run = [&](std::shared_ptr<comm::Communicator> comm) {
    auto e = engine(comm);
    FitOptions options = quietOptions(logger);
    options.steps = steps;
    if (change) change(options);
    fit(*e, train, test, options, callbacks);
    if (e->isPrimary()) result = weights(e->model());
  };
  if (ranks == 0) {
    run(nullptr);
  } else {
    auto make = nativeRanks(ranks);
    runThreads(ranks, [&](int rank) { run(make(rank)); });
  }
  return result;
}

TEST(FitTest, TwoRanksTakeTheStepsOfOneDevice) {
  const std::vector<float> initial = weights(*model());
  const std::vector<float> one = trainOn(0, 24);
  const std::vector<float> two = trainOn(2, 24);
  EXPECT_GT(maxAbsDiff(one, initial), 1e-2) << "training did not move the weights";
  EXPECT_LT(maxAbsDiff(one, two), 2e-5);
}

TEST(FitTest, AccumulatedMicroBatchesTakeTheStepsOfTheWholeBatch) {
  // The gradients of each step travel once whatever the micro-batches: as many bytes a step.
  double bytesWhole = 0.0, bytesAccumulated = 0.0;
  FitCallbacks whole, accumulated;
  whole.onEnd = [&](const FitSummary& s) { return bytesWhole = s.gradBytesPerStep, observe::Fields{}; };
  accumulated.onEnd = [&](const FitSummary& s) { return bytesAccumulated = s.gradBytesPerStep, observe::Fields{}; };
  const std::vector<float> one = trainOn(0, 12);
  const std::vector<float> oneInFour = trainOn(0, 12, [](FitOptions& o) { o.accumulate = 4; });
  const std::vector<float> two = trainOn(2, 12, nullptr, whole);
  const std::vector<float> twoInTwo = trainOn(2, 12, [](FitOptions& o) { o.accumulate = 2; }, accumulated);
  EXPECT_GT(maxAbsDiff(one, weights(*model())), 1e-2) << "training did not move the weights";
  EXPECT_LT(maxAbsDiff(one, oneInFour), 2e-5);
  EXPECT_LT(maxAbsDiff(one, twoInTwo), 2e-5);
  EXPECT_LT(maxAbsDiff(two, twoInTwo), 2e-5);
  EXPECT_GT(bytesWhole, 0.0);
  EXPECT_EQ(bytesAccumulated, bytesWhole);
  // 32 samples a step do not split into 3 equal micro-batches.
  EXPECT_THROW(trainOn(0, 1, [](FitOptions& o) { o.accumulate = 3; }), InvalidArgument);
}

// A run of 20 steps on `ranks` ranks (0: one process) checkpointing into `dir` every 4 steps
// that stops at step 10 with an exception on every rank.
void stopAtStep10(int ranks, const std::string& dir) {
  FitCallbacks crash;
  crash.onStepBegin = [](int64_t step) {
    if (step == 10) KOLO_THROW(Error, "stopped at step 10");
  };
  EXPECT_THROW(trainOn(ranks, 20, [&](FitOptions& o) {
    o.checkpointDir = dir;
    o.checkpointEvery = 4;
  }, crash), Error);
}

TEST(FitTest, AResumedRunEndsBitIdenticalToAStraightOne) {
  const std::string dir = freshDir("resume");
  const std::vector<float> straight = trainOn(2, 20);
  // The first run stops at step 10 (an exception on every rank), after its checkpoint of 8.
  stopAtStep10(2, dir);
  const std::vector<float> resumed = trainOn(2, 20, [&](FitOptions& o) {
    o.checkpointDir = dir;
    o.resumeDir = dir;
  });
  EXPECT_EQ(straight, resumed);
  // And on one device from the two ranks' checkpoint: the layout may change on resume.
  const std::vector<float> onOne = trainOn(0, 20, [&](FitOptions& o) { o.resumeDir = dir; });
  EXPECT_LT(maxAbsDiff(straight, onOne), 2e-5);
  fs::remove_all(dir);
}

TEST(FitTest, AResumeWithAnotherIdentityIsRefused) {
  const std::string dir = freshDir("identity");
  trainOn(0, 2, [&](FitOptions& o) {
    o.checkpointDir = dir;
    o.identity = {{"batch", "32"}};
  });
  try {
    trainOn(0, 4, [&](FitOptions& o) {
      o.resumeDir = dir;
      o.identity = {{"batch", "64"}};
    });
    FAIL() << "resumed a checkpoint of another identity";
  } catch (const Mismatch& e) {
    EXPECT_NE(std::string(e.what()).find("written with batch 32, this run has batch 64"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// Without an identity of the caller's, fit records the global batch and seed itself: a
// resume at another batch is refused in the options' words, not by the loader's position.
TEST(FitTest, TheLibraryFillsTheIdentityItKnows) {
  const std::string dir = freshDir("filled-identity");
  trainOn(0, 2, [&](FitOptions& o) { o.checkpointDir = dir; });
  try {
    trainOn(0, 4, [&](FitOptions& o) {
      o.resumeDir = dir;
      o.batch = 64;
    });
    FAIL() << "resumed a checkpoint of another global batch";
  } catch (const Mismatch& e) {
    EXPECT_NE(std::string(e.what()).find("FitOptions::resumeDir " + dir), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("written with batch 32, this run has batch 64"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// A resume directory that is not there is a wrong path; one without a good checkpoint is a
// run that never saved: the two are told apart, both as FileError naming resumeDir.
TEST(FitTest, AMissingResumeDirectoryIsToldApartFromAnEmptyOne) {
  const std::string dir = freshDir("empty-resume");
  fs::create_directories(dir);
  for (const auto& [where, said] : {std::pair{dir + "/absent", std::string(": no such directory")},
                                    std::pair{dir, std::string(": no good checkpoint there")}}) {
    try {
      trainOn(0, 2, [&](FitOptions& o) { o.resumeDir = where; });
      FAIL() << "resumed from " << where;
    } catch (const FileError& e) {
      EXPECT_NE(std::string(e.what()).find("FitOptions::resumeDir " + where + said), std::string::npos)
          << e.what();
    }
  }
  fs::remove_all(dir);
}

// A checkpoint at an epoch's end is recorded as the next epoch's start (any trainer resumes
// it there), not as "after the last batch" of the epoch it ended.
TEST(FitTest, AnEpochsEndIsRecordedAsTheNextEpochsStart) {
  const std::string dir = freshDir("epoch-end");
  trainOn(0, 0, [&](FitOptions& o) {
    o.epochs = 1;
    o.checkpointDir = dir;
    o.checkpointEvery = 16;  // 512 samples at 32: the epoch's 16th step is its last
  });
  const checkpoint::CheckpointManager manager(dir, 3, false, [](const std::string&) {});
  const checkpoint::CheckpointContents contents =
      checkpoint::CheckpointManager::read(manager.latestGood()->path);
  EXPECT_EQ(contents.state.step, 16);
  EXPECT_EQ(contents.state.loader.epoch, 1);
  EXPECT_EQ(contents.state.loader.batch, 0);
  fs::remove_all(dir);
}

// A dataset of one's own whose gather breaks the data::Dataset contract in one way.
class BrokenDataset : public data::Dataset {
 public:
  enum class Fault { Float64Inputs, ShortInputs, LabelOutOfRange };
  explicit BrokenDataset(Fault fault) : fault_(fault), data_(dataset(64, 1)) {}
  int64_t size() const override { return data_->size(); }
  data::Batch gather(const std::vector<int64_t>& indices) const override {
    data::Batch batch = data_->gather(indices);
    if (fault_ == Fault::Float64Inputs) batch.inputs = batch.inputs.to(DType::F64);
    if (fault_ == Fault::ShortInputs) batch.inputs = batch.inputs.slice(0, 1, batch.inputs.shape()[0]).contiguous();
    if (fault_ == Fault::LabelOutOfRange) {
      std::vector<int64_t> labels(indices.size(), 0);
      for (size_t i = 0; i < indices.size(); ++i) labels[i] = indices[i] == 13 ? kClasses + 2 : 1;
      batch.labels = Tensor::fromVector({static_cast<int64_t>(labels.size())}, labels);
    }
    return batch;
  }

 private:
  Fault fault_;
  std::shared_ptr<data::TensorDataset> data_;
};

// A dataset that breaks its contract is named as the dataset's fault, with its index, not as
// a failed check inside a kernel.
TEST(FitTest, ADatasetThatBreaksItsContractIsNamed) {
  using Fault = BrokenDataset::Fault;
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  for (const auto& [fault, said] :
       {std::pair{Fault::Float64Inputs, std::string("returned f64 inputs, but the model's parameters are f32")},
        std::pair{Fault::ShortInputs, std::string("returned inputs of shape [31, 12]: one row per index")},
        std::pair{Fault::LabelOutOfRange, std::string("the training set's label 7 at index 13 is outside "
                                                      "the model's 5 classes")}}) {
    auto e = engine(nullptr);
    FitOptions options = quietOptions(logger);
    options.epochs = 1;
    try {
      fit(*e, std::make_shared<BrokenDataset>(fault), nullptr, options);
      ADD_FAILURE() << said << ": not refused";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(dynamic_cast<const InternalError*>(&error), nullptr) << error.what();
      EXPECT_NE(std::string(error.what()).find(said), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("the training set"), std::string::npos) << error.what();
    }
  }
}

TEST(EvaluateTest, RanksShareTheWorkAndAgreeWithOneProcess) {
  const auto data = dataset(301, 4);  // not divisible by the ranks
  auto net = model();
  const EvaluateResult alone = evaluate(*net, *data, {.batch = 64, .loss = nullptr, .communicator = nullptr});
  EXPECT_EQ(alone.samples, 301);
  EXPECT_GT(alone.loss, 0.0);
  auto make = nativeRanks(3);
  std::vector<EvaluateResult> results(3);
  runThreads(3, [&](int rank) {
    auto mine = model();
    results[static_cast<size_t>(rank)] =
        evaluate(*mine, *data, {.batch = 7, .loss = nullptr, .communicator = make(rank)});
  });
  for (const EvaluateResult& r : results) {
    EXPECT_EQ(r.accuracy, alone.accuracy);
    EXPECT_NEAR(r.loss, alone.loss, 1e-6 * alone.loss);
    EXPECT_EQ(r.samples, 301);
  }
}

// A Stateful of its own: a counter kept in a tensor and a metadata string.
struct Counter : Stateful {
  int64_t value = 0;
  std::string tensorName = "counter.value";
  StateDict stateDict() override {
    StateDict state;
    state.tensors.emplace_back(tensorName, Tensor::fromVector({1}, std::vector<int64_t>{value}));
    state.metadata["counter"] = std::to_string(value);
    return state;
  }
  void loadStateDict(const StateDict& state) override {
    for (const auto& [name, tensor] : state.tensors)
      if (name == tensorName) value = static_cast<int64_t>(tensor.item());
  }
};

TEST(StateTest, ObjectsKeepTheirSectionsAndNamesMayNotCollide) {
  const std::string dir = freshDir("state");
  auto e = engine(nullptr);
  Counter counter;
  counter.value = 41;
  const CheckpointOptions options{.directory = dir, .keep = 2, .communicator = nullptr,
                                  .identity = {{"model", "toy"}}, .warn = nullptr};
  const std::string path =
      save({e.get(), &counter}, {.step = 7, .loader = {1, 3}, .path = ""}, options);
  EXPECT_EQ(path, dir + "/ckpt-000000007");
  const checkpoint::CheckpointContents contents = checkpoint::CheckpointManager::read(path);
  EXPECT_EQ(contents.state.extra.at("counter"), "41");
  EXPECT_EQ(contents.state.extra.at("model"), "toy");
  EXPECT_EQ(contents.state.extra.at("strategy"), "one-device");
  EXPECT_EQ(contents.optimizerKind, "sgd");
  EXPECT_EQ(contents.weights.size(), e->model().stateDict().size());

  Counter restored;
  auto fresh = engine(nullptr);
  const Position at = load({fresh.get(), &restored}, options);
  EXPECT_EQ(at.step, 7);
  EXPECT_EQ(at.loader.epoch, 1);
  EXPECT_EQ(at.loader.batch, 3);
  EXPECT_EQ(restored.value, 41);
  EXPECT_EQ(weights(fresh->model()), weights(e->model()));

  Counter twin;  // claims the same tensor name
  EXPECT_THROW(save({&counter, &twin}, {.step = 8, .loader = {}, .path = ""}, options),
               InvalidArgument);
  fs::remove_all(dir);
}

TEST(FitTest, MetricsLinesKeepTheSchemaThatKoloReportReads) {
  const std::string dir = freshDir("metrics");
  fs::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  int epochsEnded = 0;
  const auto train = dataset(128, 1);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  auto e = engine(nullptr);
  FitOptions options = quietOptions(logger);
  options.epochs = 2;
  options.metricsPath = path;
  options.metricsEvery = 2;
  FitCallbacks callbacks;
  callbacks.onEpochEnd = [&](const EpochEnd& end) {
    ++epochsEnded;
    EXPECT_TRUE(end.validation.has_value());
  };
  // onEnd's fields join the final line (the lm's held-out loss under kolo train).
  callbacks.onEnd = [](const FitSummary& done) { return observe::Fields{{"extra_figure", done.steps}}; };
  const FitSummary summary = fit(*e, train, dataset(64, 2), options, callbacks);
  EXPECT_EQ(summary.steps, 8);  // 2 epochs of 128 / 32
  EXPECT_EQ(epochsEnded, 2);
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_GE(lines.size(), 5u);
  EXPECT_EQ(lines.front()["event"], "start");
  EXPECT_EQ(lines.front()["strategy"], "one-device");
  int intervals = 0, epochs = 0;
  for (const auto& line : lines) {
    if (line.value("kind", "") == "interval") ++intervals;
    if (line.contains("epoch") && !line.contains("final")) {
      ++epochs;
      EXPECT_TRUE(line.contains("test_accuracy") && line.contains("train_loss") &&
                  line.contains("samples_per_s") && line.contains("lr"));
    }
  }
  EXPECT_EQ(intervals, 4);
  EXPECT_EQ(epochs, 2);
  EXPECT_EQ(lines[lines.size() - 2]["event"], "end");
  EXPECT_EQ(lines.back()["final"], true);
  EXPECT_EQ(lines.back()["step"], 8);
  EXPECT_EQ(lines.back()["extra_figure"], 8);
  fs::remove_all(dir);
}

TEST(FitTest, EveryRankReportsItsFiguresAndTheValidationFigures) {
  const auto train = dataset(512, 1);
  const auto test = dataset(128, 2);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  auto make = nativeRanks(2);
  std::vector<FitSummary> summaries(2);
  std::vector<EvaluateResult> after(2);
  RankReport report;
  const std::string status = freshDir("status") + "-status";
  runThreads(2, [&](int rank) {
    auto e = engine(make(rank));
    FitOptions options = quietOptions(logger);
    options.steps = 6;
    options.timingSkip = 2;
    options.statusFile = status;
    summaries[static_cast<size_t>(rank)] = fit(*e, train, test, options);
    after[static_cast<size_t>(rank)] = e->evaluate(*test);
    if (rank == 0) report = rankReport(*e, summaries[0]);
  });
  // Rank 0's report: a line per rank holding all 3 layers, the strategy's step.
  ASSERT_EQ(report.ranks.size(), 2u);
  EXPECT_EQ(report.ranks[1].rfind("rank 1: layers 0-2  compute ", 0), 0u)
      << report.ranks[1];
  // The layout's step is the slowest rank's.
  char step[32];
  std::snprintf(step, sizeof step, "%.2f",
                1000.0 * std::max(summaries[0].ranks[0].stepSeconds, summaries[0].ranks[1].stepSeconds));
  EXPECT_EQ(report.layout, "multi-worker-mirrored ranks 2 replicas 2 step_ms " + std::string(step));
  for (size_t rank = 0; rank < 2; ++rank) {
    const FitSummary& summary = summaries[rank];
    EXPECT_EQ(summary.validationLoss, after[rank].loss);
    EXPECT_EQ(summary.validationAccuracy, after[rank].accuracy);
    ASSERT_EQ(summary.ranks.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const RankFigures& f = summary.ranks[static_cast<size_t>(r)];
      const RankFigures& other = summaries[1 - rank].ranks[static_cast<size_t>(r)];
      EXPECT_EQ(f.rank, r);
      EXPECT_GT(f.stepSeconds, 0.0);
      EXPECT_GT(f.computeSeconds, 0.0);
      // The weights, gradients and momentum of the model at least; a step's own on top.
      EXPECT_GE(f.peakTensorBytes, 3 * (kFeatures * 32 + 32 + 32 * kClasses + kClasses) * 4);
      EXPECT_GT(f.peakStepBytes, 0);
      EXPECT_EQ(f.peakMicroBatchesHeld, 1);
      EXPECT_EQ(f.peakBoundaryBytes, 0);
      EXPECT_GT(f.peakResidentBytes, f.peakTensorBytes);
      EXPECT_EQ(f.stepSeconds, other.stepSeconds) << "the ranks were told different figures";
    }
  }
  // Each rank's status line, as another process (kolo status) reads it.
  const std::vector<RankStatusLine> lines = readRankStatus(status);
  ASSERT_EQ(lines.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const RankStatusLine& line = lines[static_cast<size_t>(r)];
    EXPECT_EQ(line.rank, r);
    EXPECT_EQ(line.state, "done");
    EXPECT_FALSE(line.gone);
    EXPECT_EQ(line.step, 6);
    EXPECT_EQ(line.totalSteps, 6);
    EXPECT_EQ(line.pid, static_cast<int64_t>(::getpid()));
    fs::remove(status + ".rank-" + std::to_string(r));
  }
  EXPECT_EQ(findStraggler(lines).rank, -1);  // both done
}

TEST(FitTest, TheStragglerIsTheTrainingRankFurthestBehind) {
  auto line = [](int rank, const char* state, int64_t step, bool gone = false) {
    RankStatusLine l;
    l.rank = rank;
    l.state = state;
    l.step = step;
    l.gone = gone;
    return l;
  };
  const Straggler behind = findStraggler({line(0, "training", 40), line(1, "training", 31), line(2, "training", 44),
                                          line(3, "training", 12, true), line(4, "evaluating", 20)});
  EXPECT_EQ(behind.rank, 1);
  EXPECT_EQ(behind.step, 31);
  EXPECT_EQ(behind.furthestStep, 44);
  EXPECT_EQ(findStraggler({line(0, "training", 7), line(1, "training", 7)}).rank, -1);
  EXPECT_EQ(findStraggler({}).rank, -1);
  // kolo status's table: a gone rank marked, each line's age, the straggler named last.
  RankStatusLine written = line(1, "training", 31);
  written.totalSteps = 50;
  written.updated = 1000.0;
  const std::string table =
      rankStatusTable({line(0, "training", 40), written, line(3, "training", 12, true)}, 1002.5);
  EXPECT_EQ(table.substr(0, table.find('\n')).find("rank  pid"), 0u) << table;
  EXPECT_NE(table.find("\n1     0        training      31/50"), std::string::npos) << table;
  EXPECT_NE(table.find("2.5 s ago\n"), std::string::npos) << table;
  EXPECT_NE(table.find("training(gone)"), std::string::npos) << table;
  EXPECT_NE(table.find("behind: rank 1 (step 31; the furthest rank is at step 40)\n"), std::string::npos) << table;
}

// Returns its input: a model whose outputs the test writes itself.
struct Identity : nn::Module {
  Tensor forward(const Tensor& x) override { return x; }
};

TEST(EvaluateTest, SequencesCountEveryPosition) {
  // Outputs (2, 3, 4): the argmax of each position's scores against labels (2, 3), 4 of the 6
  // right.
  const Tensor scores = Tensor::fromVector({2, 3, 4}, std::vector<float>{
      9, 0, 0, 0,  0, 9, 0, 0,  0, 0, 9, 0,    // argmax 0, 1, 2
      0, 0, 0, 9,  9, 0, 0, 0,  0, 9, 0, 0});  // argmax 3, 0, 1
  const Tensor labels = Tensor::fromVector({2, 3}, std::vector<int64_t>{0, 1, 3, 3, 2, 1});
  struct Sequences : data::Dataset {
    Tensor scores, labels;
    int64_t size() const override { return 2; }
    data::Batch gather(const std::vector<int64_t>& rows) const override {
      return {index(scores, rows), index(labels, rows), {}};
    }
    static Tensor index(const Tensor& t, const std::vector<int64_t>& rows) {
      std::vector<Tensor> picked;
      for (int64_t row : rows) picked.push_back(t.slice(0, row, row + 1));
      return cat(picked, 0);
    }
  } data;
  data.scores = scores;
  data.labels = labels;
  Identity identity;
  const auto zero = [](const Tensor&, const Tensor&) { return Tensor::zeros({1}); };
  const EvaluateResult result = evaluate(identity, data, {.batch = 1, .loss = zero, .communicator = nullptr});
  EXPECT_EQ(result.samples, 2);
  EXPECT_DOUBLE_EQ(result.accuracy, 4.0 / 6.0);
  // The default loss takes them too: the mean cross-entropy over every position.
  const EvaluateResult byDefault = evaluate(identity, data, {.batch = 2, .loss = nullptr, .communicator = nullptr});
  EXPECT_NEAR(byDefault.loss, crossEntropy(scores.reshape({6, 4}), labels.reshape({6})).item(), 1e-6);
  EXPECT_DOUBLE_EQ(byDefault.accuracy, 4.0 / 6.0);
}

TEST(FitTest, ARequeuedSlurmJobResumesFromItsCheckpoints) {
  const std::string dir = freshDir("requeue");
  const std::vector<float> straight = trainOn(0, 20);
  EXPECT_EQ(resumeDirectory("", dir), "") << "no requeue: a fresh start";
  stopAtStep10(0, dir);
  // The job script runs again with SLURM_RESTART_COUNT=1 and the same flags.
  ::setenv("SLURM_RESTART_COUNT", "1", 1);
  EXPECT_EQ(resumeDirectory("", dir), dir);
  EXPECT_EQ(resumeDirectory("/elsewhere", dir), "/elsewhere") << "an explicit resume wins";
  EXPECT_EQ(resumeDirectory("", dir + "-empty"), "") << "nothing to resume: a fresh start";
  const std::vector<float> requeued = trainOn(0, 20, [&](FitOptions& o) { o.checkpointDir = dir; });
  ::unsetenv("SLURM_RESTART_COUNT");
  EXPECT_EQ(straight, requeued);
  fs::remove_all(dir);
}

// Without a reducer (fsdp: the gathers and reduce-scatters run inside forward and backward)
// the interval lines' communication is the time the ranks waited in it, not 0; one device
// communicates nothing.
TEST(FitTest, IntervalLinesTimeTheCommunicationOfEnginesWithoutAReducer) {
  const std::string dir = freshDir("fsdp_comm");
  fs::create_directories(dir);
  const auto train = dataset(256, 1);
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  auto intervals = [&](int ranks) {
    const std::string path = dir + "/metrics" + std::to_string(ranks) + ".jsonl";
    auto run = [&](std::shared_ptr<comm::Communicator> comm) {
      DataParallelOptions options;
      options.strategy.kind = comm ? parallel::StrategyKind::FullyShardedDataParallel : parallel::StrategyKind::OneDevice;
      options.strategy.communicator = comm;
      DataParallelEngine e(model, sgd, options);
      EXPECT_EQ(e.reducer(), nullptr);
      FitOptions fitOptions = quietOptions(logger);
      fitOptions.steps = 8;
      fitOptions.metricsPath = path;
      fitOptions.metricsEvery = 4;
      const FitSummary summary = fit(e, train, nullptr, fitOptions);
      for (const RankFigures& f : summary.ranks) EXPECT_LE(f.computeSeconds, f.stepSeconds);
    };
    if (ranks == 1) {
      run(nullptr);
    } else {
      auto make = nativeRanks(ranks);
      runThreads(ranks, [&](int rank) { run(make(rank)); });
    }
    std::vector<nlohmann::json> found;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json json = nlohmann::json::parse(line);
      if (json.value("kind", "") == "interval") found.push_back(json);
    }
    EXPECT_EQ(found.size(), 2u);
    return found;
  };
  for (const nlohmann::json& line : intervals(2)) {
    EXPECT_GT(line["comm_s"].get<double>(), 0.0) << line.dump();
    EXPECT_GE(line["exposed_comm_s"].get<double>() + line["wait_s"].get<double>(), line["comm_s"].get<double>() * 0.999)
        << line.dump();
  }
  for (const nlohmann::json& line : intervals(1)) EXPECT_EQ(line["comm_s"].get<double>(), 0.0) << line.dump();
  fs::remove_all(dir);
}

// A dataset of one's own that leaves a batch's indices out still trains balanced: the loader
// fills them in (each rank's share of the global batch is cut by them).
TEST(FitTest, ABalancedRunTakesADatasetThatLeavesItsIndicesOut) {
  struct WithoutIndices : data::Dataset {
    std::shared_ptr<data::TensorDataset> inner = dataset(256, 1);
    int64_t size() const override { return inner->size(); }
    data::Batch gather(const std::vector<int64_t>& rows) const override {
      data::Batch batch = inner->gather(rows);
      batch.indices.clear();
      return batch;
    }
  };
  const auto train = std::make_shared<WithoutIndices>();
  observe::Logger logger(stderr, observe::LogLevel::Warn);
  auto make = nativeRanks(2);
  std::vector<int64_t> steps(2);
  runThreads(2, [&](int rank) {
    DataParallelOptions options;
    options.strategy.kind = parallel::StrategyKind::MultiWorkerMirrored;
    options.strategy.communicator = make(rank);
    options.balanceBatch = 32;
    DataParallelEngine e(model, sgd, options);
    FitOptions fitOptions = quietOptions(logger);
    fitOptions.steps = 4;
    FitCallbacks callbacks;
    callbacks.onStepEnd = [](const StepEnd& end) { EXPECT_EQ(end.batch->indices.size(), 32u); };
    steps[static_cast<size_t>(rank)] = fit(e, train, nullptr, fitOptions, callbacks).steps;
  });
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 4}));
}

}  // namespace
}  // namespace kolo::train
