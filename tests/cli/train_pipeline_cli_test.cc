// End-to-end tests of `kolo train --model lm`, `--strategy pipeline`, `--strategy tensor` and
// `--mesh` (real processes under `kolo run`): pipelined, tensor-parallel (also sequence-
// parallel) and hybrid runs (up to data x pipeline x tensor on 8 ranks) save the weights
// one-rank training reaches, under the whole model's names; the file loads into one-rank
// training and back into a pipeline; checkpoints written by one layout resume in another
// (one rank, stages, tensor ranks, a 3-way mesh) to the weights of an uninterrupted run, and
// --metrics records the run; the mlp split into stages matches the data-parallel trainer's
// one-device run; an lm over the --memory-limit of one rank trains in four stages; bad flags
// are named; --no-shuffle trains on the text's windows in file order; --precision bf16 trains
// close to f32.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "kolo/safetensors.h"
#include "run_kolo.h"
#include "weights.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;
using kolo::testing::RunResult;
using kolo::testing::runKolo;

using kolo::testing::loadWeights;
using kolo::testing::Weights;

// Largest |a - b| over the largest |a|, over every tensor; names must agree.
double weightsDifference(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) return 1e30;
  double diff = 0.0, scale = 0.0;
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].first != b[t].first || a[t].second.size() != b[t].second.size()) return 1e30;
    for (size_t i = 0; i < a[t].second.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[t].second[i]) - b[t].second[i]));
      scale = std::max(scale, std::abs(static_cast<double>(a[t].second[i])));
    }
  }
  return diff / std::max(scale, 1e-30);
}

class TrainPipelineCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kolo_pipeline_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream text(file("text.txt"));
    for (int i = 0; i < 40; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string kolo() { return std::string(KOLO_BINARY_DIR) + "/src/cli/kolo"; }
  // SGD: its update is linear in the gradient, so the rounding of gradients accumulated
  // over micro-batches stays at float level (Adam divides by sqrt(v) and magnifies it where a
  // gradient is near zero; see docs/model_parallel.md).
  std::string lm(int steps, const std::string& data = "", const std::string& sizes = "") const {
    return "train --model lm --data " + (data.empty() ? file("text.txt") : data) + " " +
           (sizes.empty() ? "--layers 2 --d-model 16 --heads 2 --seq-len 8" : sizes) +
           " --batch 8 --optimizer sgd --lr 0.1 --momentum 0.9 --sample-bytes 16 --quiet --steps " +
           std::to_string(steps);
  }
  fs::path dir_;
};

// --no-shuffle feeds the windows at bytes (s*B + i)*T: two steps of batch 8 at T 8 read the
// text's first 129 bytes only, so a text that differs after them trains to the same weights;
// with the default random windows it does not (the control).
TEST_F(TrainPipelineCliTest, NoShuffleTrainsOnTheTextsFirstWindows) {
  std::ifstream in(file("text.txt"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t i = 2 * 8 * 8 + 1; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + i % 26);
  std::ofstream(file("changed.txt"), std::ios::binary) << bytes;
  auto weights = [&](const std::string& text, const std::string& order, const std::string& name) {
    const RunResult r = runKolo(lm(2, file(text)) + order + " --save " + file(name));
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return loadWeights(file(name));
  };
  EXPECT_EQ(weightsDifference(weights("text.txt", " --no-shuffle", "a.safetensors"),
                              weights("changed.txt", " --no-shuffle", "b.safetensors")),
            0.0);
  EXPECT_GT(weightsDifference(weights("text.txt", "", "c.safetensors"), weights("changed.txt", "", "d.safetensors")),
            1e-4);
}

// --precision bf16 rounds the operands of every product: the weights move off f32's, by
// little (the products keep 8 bits of mantissa, the sums 24).
TEST_F(TrainPipelineCliTest, PrecisionBf16TrainsCloseToF32) {
  auto weights = [&](const std::string& precision) {
    const RunResult r = runKolo(lm(6) + " --precision " + precision + " --save " + file(precision + ".safetensors"));
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return loadWeights(file(precision + ".safetensors"));
  };
  const double difference = weightsDifference(weights("f32"), weights("bf16"));
  EXPECT_GT(difference, 0.0);
  EXPECT_LT(difference, 2e-2);
  const RunResult bad = runKolo(lm(1) + " --precision fp8");
  EXPECT_NE(bad.exitCode, 0);
  EXPECT_NE(bad.output.find("--precision"), std::string::npos) << bad.output;
}

TEST_F(TrainPipelineCliTest, PipelineSavesTheOneRankWeightsAndLoadsBothWays) {
  const RunResult one = runKolo(lm(6) + " --save " + file("one.safetensors"));
  ASSERT_EQ(one.exitCode, 0) << one.output;
  EXPECT_NE(one.output.find("sample:"), std::string::npos) << one.output;
  const RunResult piped = runKolo("run -n 2 -- " + kolo() + " " + lm(6) +
                                  " --strategy pipeline --stages 2 --micro-batches 4 --schedule 1f1b --save " +
                                  file("pipe.safetensors"));
  ASSERT_EQ(piped.exitCode, 0) << piped.output;
  EXPECT_NE(piped.output.find("measured_over_ideal"), std::string::npos) << piped.output;
  const Weights expected = loadWeights(file("one.safetensors"));
  ASSERT_EQ(expected.size(), 2u + 2 * 12 + 2 + 1);  // tok, pos; 2 blocks; ln; head
  EXPECT_LT(weightsDifference(expected, loadWeights(file("pipe.safetensors"))), 1e-5);

  // Tensor parallel on 2 ranks (embedding and head by vocabulary, attention by heads, MLP
  // split; with sequence-parallel norms too) reaches the same weights.
  for (const char* flags : {"", " --sequence-parallel"}) {
    const RunResult tensor =
        runKolo("run -n 2 -- " + kolo() + " " + lm(6) + " --strategy tensor --tp 2 --save " +
                file("tp.safetensors") + flags);
    ASSERT_EQ(tensor.exitCode, 0) << tensor.output;
    EXPECT_LT(weightsDifference(expected, loadWeights(file("tp.safetensors"))), 1e-5) << flags;
  }

  // Hybrids: 2 replicas of a 2-stage pipeline, and of a 2-rank tensor group; 2 stages each
  // split over 2 tensor ranks.
  for (const char* mesh :
       {"dp=2,pp=2 --micro-batches 2", "dp=2,tp=2", "dp=1,pp=2,tp=2 --micro-batches 2"}) {
    const RunResult hybrid = runKolo("run -n 4 -- " + kolo() + " " + lm(6) + " --mesh " + mesh + " --save " +
                                     file("mesh.safetensors"));
    ASSERT_EQ(hybrid.exitCode, 0) << hybrid.output;
    EXPECT_LT(weightsDifference(expected, loadWeights(file("mesh.safetensors"))), 1e-5) << mesh;
  }

  // The pipeline's file continues on one rank, and one rank's file in a 3-stage GPipe run
  // with recomputation and given split points: both reach the same weights.
  const RunResult back = runKolo(lm(3) + " --init " + file("pipe.safetensors") + " --save " + file("back.safetensors"));
  ASSERT_EQ(back.exitCode, 0) << back.output;
  const RunResult again = runKolo("run -n 3 -- " + kolo() + " " + lm(3) + " --init " + file("one.safetensors") +
                                  " --strategy pipeline --stages 3 --split-at 1,3 --micro-batches 2 --schedule gpipe "
                                  "--recompute --save " + file("again.safetensors"));
  ASSERT_EQ(again.exitCode, 0) << again.output;
  EXPECT_LT(weightsDifference(loadWeights(file("back.safetensors")), loadWeights(file("again.safetensors"))), 1e-5);
  EXPECT_GT(weightsDifference(loadWeights(file("back.safetensors")), expected), 1e-4) << "--init was not trained on";
}

// 8 ranks: 2 replicas of 2 stages, each split over 2 tensor ranks, with sequence parallelism.
TEST_F(TrainPipelineCliTest, ThreeWayMeshMatchesOneRank) {
  const RunResult one = runKolo(lm(6) + " --save " + file("one.safetensors"));
  ASSERT_EQ(one.exitCode, 0) << one.output;
  const RunResult mesh =
      runKolo("run -n 8 -- " + kolo() + " " + lm(6) +
              " --mesh dp=2,pp=2,tp=2 --micro-batches 2 --sequence-parallel --save " +
              file("mesh.safetensors"));
  ASSERT_EQ(mesh.exitCode, 0) << mesh.output;
  EXPECT_NE(mesh.output.find("pipeline stages 2 micro_batches 2"), std::string::npos)
      << mesh.output;
  EXPECT_LT(weightsDifference(loadWeights(file("one.safetensors")),
                              loadWeights(file("mesh.safetensors"))),
            1e-5);
}

// A run stopped after its checkpoint of step 3 continues in other layouts to the weights of
// an uninterrupted 6-step run: the checkpoints hold whole tensors (momentum included) under
// the model's names.
TEST_F(TrainPipelineCliTest, CheckpointsResumeInAnyLayout) {
  const RunResult whole = runKolo(lm(6) + " --save " + file("whole.safetensors"));
  ASSERT_EQ(whole.exitCode, 0) << whole.output;
  const Weights expected = loadWeights(file("whole.safetensors"));
  const std::string run2 = "run -n 2 -- " + kolo() + " ";
  const std::string run4 = "run -n 4 -- " + kolo() + " ";
  struct Case {
    std::string name, writer, reader;
  };
  const std::vector<Case> cases = {
      {"pipeline to one rank", run2 + lm(6) + " --strategy pipeline --stages 2 --micro-batches 2",
       lm(6)},
      {"pipeline to tensor", run2 + lm(6) + " --strategy pipeline --stages 2 --micro-batches 2",
       run2 + lm(6) + " --strategy tensor --tp 2"},
      {"one rank to a 3-way mesh", lm(6),
       run4 + lm(6) + " --mesh dp=1,pp=2,tp=2 --micro-batches 2"},
      {"3-way mesh to pipeline", run4 + lm(6) + " --mesh dp=1,pp=2,tp=2 --sequence-parallel",
       run2 + lm(6) + " --strategy pipeline --stages 2 --split-at 2"},
  };
  int index = 0;
  for (const Case& c : cases) {
    const std::string dir = file("ck" + std::to_string(index++));
    const RunResult first =
        runKolo(c.writer + " --checkpoint-dir " + dir +
                " --checkpoint-every 3 --fail-at-step 4 --metrics " + file("metrics.jsonl"));
    EXPECT_NE(first.exitCode, 0) << c.name << "\n" << first.output;
    ASSERT_TRUE(fs::exists(fs::path(dir) / "ckpt-000000003")) << c.name << "\n" << first.output;
    const RunResult resumed =
        runKolo(c.reader + " --resume " + dir + " --metrics " + file("metrics.jsonl") + " --save " +
                file("resumed.safetensors"));
    ASSERT_EQ(resumed.exitCode, 0) << c.name << "\n" << resumed.output;
    EXPECT_NE(resumed.output.find("ckpt-000000003 step=3"), std::string::npos) << c.name << "\n"
                                                                               << resumed.output;
    EXPECT_LT(weightsDifference(expected, loadWeights(file("resumed.safetensors"))), 1e-5)
        << c.name;
  }
  // AdamW's moments, split with their parameters over 2 tensor ranks, resume exactly. (Across
  // layouts Adam magnifies the rounding of other sum orders; see the top of this page's doc.)
  std::string adamLm = lm(6);
  adamLm.replace(adamLm.find("--optimizer sgd --lr 0.1 --momentum 0.9"), 39,
                 "--optimizer adamw --lr 0.01");
  const std::string adam = run2 + adamLm + " --strategy tensor --tp 2";
  const RunResult straight = runKolo(adam + " --save " + file("adam.safetensors"));
  ASSERT_EQ(straight.exitCode, 0) << straight.output;
  const RunResult stopped = runKolo(adam + " --checkpoint-dir " + file("ck-adam") +
                                    " --checkpoint-every 3 --fail-at-step 4");
  EXPECT_NE(stopped.exitCode, 0) << stopped.output;
  const RunResult continued =
      runKolo(adam + " --resume " + file("ck-adam") + " --save " + file("adam2.safetensors"));
  ASSERT_EQ(continued.exitCode, 0) << continued.output;
  EXPECT_EQ(weightsDifference(loadWeights(file("adam.safetensors")),
                              loadWeights(file("adam2.safetensors"))),
            0.0);

  // The last metrics file: the first run's start and interval lines, then the resumed run's.
  std::ifstream in(file("metrics.jsonl"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* record : {"\"event\":\"start\"", "\"event\":\"resume\"", "\"kind\":\"interval\"",
                             "\"final\":true", "\"held_out_loss\""})
    EXPECT_NE(text.find(record), std::string::npos) << record << " in\n" << text;
  EXPECT_LT(text.find("\"event\":\"start\""), text.find("\"event\":\"resume\"")) << text;
}

TEST_F(TrainPipelineCliTest, MlpStagesMatchTheOneDeviceTrainer) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const std::string common =
      "train --model mlp --no-shuffle --batch 64 --optimizer sgd --lr 0.05 --quiet --train-limit 1024 --steps 8 ";
  const RunResult one = runKolo(common + "--save " + file("mlp1.safetensors"));
  ASSERT_EQ(one.exitCode, 0) << one.output;
  const RunResult piped = runKolo("run -n 2 -- " + kolo() + " " + common +
                                  "--strategy pipeline --stages 2 --micro-batches 4 --save " + file("mlp2.safetensors"));
  ASSERT_EQ(piped.exitCode, 0) << piped.output;
  EXPECT_NE(piped.output.find("test_accuracy"), std::string::npos) << piped.output;
  EXPECT_LT(weightsDifference(loadWeights(file("mlp1.safetensors")), loadWeights(file("mlp2.safetensors"))), 1e-5);
}

TEST_F(TrainPipelineCliTest, MemoryLimitFailsOnOneRankAndTrainsInFourStages) {
  // The whole lm needs about 5.5 MiB of tensors a step; four stages need under 2 MiB each.
  const std::string sizes = "--layers 4 --d-model 64 --heads 4 --seq-len 16";
  const RunResult one = runKolo(lm(2, "", sizes) + " --memory-limit 3M");
  EXPECT_EQ(one.exitCode, 2) << one.output;
  EXPECT_NE(one.output.find("tensor memory limit of 3.0 MiB exceeded: a f32 ["), std::string::npos) << one.output;
  const RunResult four = runKolo("run -n 4 -- " + kolo() + " " + lm(2, "", sizes) +
                                 " --memory-limit 3M --strategy pipeline --stages 4 --split-at 2,4,5 "
                                 "--micro-batches 2 --recompute");
  EXPECT_EQ(four.exitCode, 0) << four.output;
  EXPECT_NE(four.output.find("held_out_loss"), std::string::npos) << four.output;
}

TEST_F(TrainPipelineCliTest, BadFlagsAreNamed) {
  struct Case {
    std::string args, expected;
    int exitCode;
  };
  const std::vector<Case> cases = {
      {lm(2) + " --strategy pipeline --stages 2", "--stages 2 needs 2 ranks", 2},
      {lm(2) + " --micro-batches 3", "--batch 8 cannot be split into 3", 2},
      {lm(2) + " --strategy pipeline --split-at 1,x", "--split-at '1,x' is not accepted", 2},
      {lm(2, file("missing.txt")), "cannot open text file", 3},
      {lm(2, "", "--layers 2 --d-model 16 --heads 3 --seq-len 8"),
       "--d-model 16 is not divisible by --heads 3", 2},
      {lm(2, "", "--layers 2 --d-model 16 --heads 2 --seq-len 4000"), "too few for windows", 2},
      {lm(2) + " --strategy mirrored --replicas 3", "--batch 8 does not split evenly over 3 replicas", 2},
      {lm(2) + " --strategy tensor --tp 2", "--tp 2 needs 2 ranks", 2},
      {lm(2) + " --mesh dp=2,pp=2", "needs 4 ranks, this job has 1", 2},
      {lm(2) + " --mesh dp=2,qq=2", "--mesh 'dp=2,qq=2' is not accepted", 2},
      {lm(2) + " --strategy fsdp --mesh pp=2,tp=2",
       "--strategy fsdp with --mesh shards the replicas of tensor ranks, --mesh dp=D,tp=T with D > 1 and no pp", 2},
      {lm(2) + " --strategy fsdp --mesh dp=2,tp=2 --sequence-parallel",
       "--sequence-parallel applies to --strategy tensor or pipeline, not to --strategy fsdp", 2},
      {lm(2) + " --sequence-parallel", "--sequence-parallel applies to --strategy tensor or pipeline", 2},
      {lm(2) + " --resume " + file("nothing"), "--resume " + file("nothing") + ": no such directory", 3},
      {lm(2) + " --memory-limit 12Q", "size '12Q' is not accepted", 2},
      {lm(2) + " --kv-heads 2", "--kv-heads applies to --arch llama, not gpt", 2},
      {lm(2, "", "--layers 2 --d-model 16 --heads 4 --seq-len 8 --arch llama --kv-heads 3"),
       "--kv-heads 3 does not divide --heads 4", 2},
  };
  for (const Case& c : cases) {
    const RunResult r = runKolo(c.args);
    EXPECT_EQ(r.exitCode, c.exitCode) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
