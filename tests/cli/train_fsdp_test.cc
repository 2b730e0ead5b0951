// End-to-end `kolo train --strategy fsdp` (real processes under kolo run): ZeRO-3 on 2 ranks
// and ZeRO-2 on 4 save the file one-device training saves (the same names and shapes, whole
// tensors, values within 1e-5) and report its test accuracy; that file starts a one-device
// run (--init); fsdp checkpoints resume exactly on the same ranks and within rounding on 4
// ranks, on one device, and from one device's; --clip-norm (also under HSDP) clips as one
// device does; the lm trains to data parallelism's weights, and its checkpoints resume
// exactly on the same ranks and within rounding in every other layout and from theirs; the
// options fsdp does not take are refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "run_kolo.h"
#include "support/fashion_mnist.h"
#include "weights.h"

namespace {

namespace fs = std::filesystem;

using kolo::testing::loadWeights;
using kolo::testing::relativeDifference;
using kolo::testing::RunResult;
using kolo::testing::runKolo;
using kolo::testing::Weights;

// The value after `key ` in the summary line.
double field(const std::string& output, const std::string& key) {
  const size_t at = output.find(key + " ");
  if (at == std::string::npos) return std::nan("");
  return std::stod(output.substr(at + key.size() + 1));
}

class TrainFsdpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    dir_ = fs::temp_directory_path() / ("kolo_fsdp_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string kolo() { return std::string(KOLO_BINARY_DIR) + "/src/cli/kolo"; }
  // Every tensor of `got` within `tolerance` of `expected`'s, under the same names.
  static void expectClose(const std::string& expectedFile, const std::string& gotFile, double tolerance,
                          const std::string& what) {
    const Weights expected = loadWeights(expectedFile);
    const Weights got = loadWeights(gotFile);
    ASSERT_EQ(got.size(), expected.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first) << what;
      ASSERT_EQ(got[i].second.size(), expected[i].second.size()) << what << " " << got[i].first;
      if (tolerance == 0.0)
        EXPECT_EQ(got[i].second, expected[i].second) << what << " " << got[i].first;
      else
        EXPECT_LE(relativeDifference(expected[i].second, got[i].second), tolerance) << what << " " << got[i].first;
    }
  }
  fs::path dir_;
};

TEST_F(TrainFsdpTest, SavesTheOneDeviceFile) {
  const std::string common =
      "train --model mlp --no-shuffle --batch 64 --optimizer adamw --threads 1 "
      "--train-limit 2048 --steps 10 --save ";
  const RunResult reference = runKolo(common + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;
  const Weights expected = loadWeights(file("one.safetensors"));
  ASSERT_EQ(expected.size(), 6u);
  const double accuracy = field(reference.output, "test_accuracy");

  for (const std::string& variant : {std::string("--workers 2 --strategy fsdp --shard full"),
                                     std::string("--workers 4 --strategy fsdp --shard grad")}) {
    const RunResult run = runKolo(common + file("fsdp.safetensors") + " " + variant);
    ASSERT_EQ(run.exitCode, 0) << variant << ":\n" << run.output;
    const Weights got = loadWeights(file("fsdp.safetensors"));
    ASSERT_EQ(got.size(), expected.size()) << variant;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first) << variant;
      ASSERT_EQ(got[i].second.size(), expected[i].second.size()) << variant << " " << got[i].first;
      EXPECT_LE(relativeDifference(expected[i].second, got[i].second), 1e-5)
          << variant << " " << got[i].first;
    }
    // Evaluation gathered the whole model: the same test accuracy as one device.
    EXPECT_NEAR(field(run.output, "test_accuracy"), accuracy, 1e-3) << run.output;
    EXPECT_NE(run.output.find("tensor memory"), std::string::npos) << run.output;
  }
  // The fsdp file starts one-device training.
  const RunResult init = runKolo("train --model mlp --train-limit 256 --steps 1 --threads 1 --init " +
                                 file("fsdp.safetensors"));
  EXPECT_EQ(init.exitCode, 0) << init.output;
  EXPECT_NE(init.output.find("loaded initial weights"), std::string::npos) << init.output;
}

TEST_F(TrainFsdpTest, ResumesFromItsCheckpointsOnAnyRankCount) {
  // SGD at a constant rate: the schedule does not depend on the run's length, and the update
  // is linear in the gradient, so another rank count changes the weights by rounding only.
  const std::string common =
      "train --model mlp --train-limit 640 --batch 64 --optimizer sgd --lr 0.05 --threads 1 --quiet ";
  const std::string fsdp2 = "--workers 2 --strategy fsdp ";
  const RunResult straight = runKolo(common + fsdp2 + "--steps 14 --save " + file("straight.safetensors"));
  ASSERT_EQ(straight.exitCode, 0) << straight.output;
  const std::string checkpoints = file("ckpt");
  const RunResult first =
      runKolo(common + fsdp2 + "--steps 8 --checkpoint-every 4 --checkpoint-dir " + checkpoints);
  ASSERT_EQ(first.exitCode, 0) << first.output;
  // Whole tensors under the model's names, as one device writes them.
  const Weights saved = loadWeights(checkpoints + "/ckpt-000000008/model.safetensors");
  const Weights names = loadWeights(file("straight.safetensors"));
  ASSERT_EQ(saved.size(), names.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].first, names[i].first);
    EXPECT_EQ(saved[i].second.size(), names[i].second.size()) << saved[i].first;
  }

  const std::string resume = "--steps 14 --resume " + checkpoints + " --save " + file("resumed.safetensors");
  const RunResult same = runKolo(common + fsdp2 + resume);
  ASSERT_EQ(same.exitCode, 0) << same.output;
  expectClose(file("straight.safetensors"), file("resumed.safetensors"), 0.0, "fsdp 2 -> 2 ranks");
  const RunResult four = runKolo(common + "--workers 4 --strategy fsdp --shard grad " + resume);
  ASSERT_EQ(four.exitCode, 0) << four.output;
  expectClose(file("straight.safetensors"), file("resumed.safetensors"), 1e-5, "fsdp 2 -> 4 ranks");
  const RunResult one = runKolo(common + resume);
  ASSERT_EQ(one.exitCode, 0) << one.output;
  expectClose(file("straight.safetensors"), file("resumed.safetensors"), 1e-5, "fsdp 2 ranks -> one device");

  const std::string oneDevice = file("one-device");
  ASSERT_EQ(runKolo(common + "--steps 8 --checkpoint-dir " + oneDevice).exitCode, 0);
  const RunResult fromOne =
      runKolo(common + fsdp2 + "--steps 14 --resume " + oneDevice + " --save " + file("resumed.safetensors"));
  ASSERT_EQ(fromOne.exitCode, 0) << fromOne.output;
  expectClose(file("straight.safetensors"), file("resumed.safetensors"), 1e-5, "one device -> fsdp 2 ranks");
}

TEST_F(TrainFsdpTest, ClipNormClipsAsOneDeviceDoes) {
  const std::string common =
      "train --model mlp --no-shuffle --train-limit 640 --batch 64 --optimizer sgd --lr 0.05 "
      "--threads 1 --quiet --steps 10 --clip-norm 0.2 --save ";
  const RunResult reference = runKolo(common + file("one.safetensors"));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;
  for (const std::string& variant : {std::string("--workers 2 --strategy fsdp"),
                                     std::string("--workers 4 --strategy fsdp --shard-group 2")}) {
    const RunResult run = runKolo(common + file("fsdp.safetensors") + " " + variant);
    ASSERT_EQ(run.exitCode, 0) << variant << ":\n" << run.output;
    expectClose(file("one.safetensors"), file("fsdp.safetensors"), 1e-5, variant);
  }
}

// The lm under fsdp and multi-worker-mirrored ends with the weights of the dp=2 mesh.
TEST_F(TrainFsdpTest, LanguageModelMatchesDataParallelism) {
  {
    std::ofstream text(file("text.txt"));
    for (int i = 0; i < 40; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const std::string lm = " train --model lm --data " + file("text.txt") +
                         " --layers 2 --d-model 16 --heads 2 --seq-len 8 --batch 8 --optimizer adamw "
                         "--sample-bytes 16 --threads 1 --quiet --steps 6 --save ";
  const RunResult dp = runKolo("run -n 2 -- " + kolo() + lm + file("dp.safetensors") + " --mesh dp=2");
  ASSERT_EQ(dp.exitCode, 0) << dp.output;
  // fsdp (ZeRO-3 and ZeRO-2) and multi-worker-mirrored (bucketed all-reduce during backward).
  for (const std::string strategy : {"fsdp --shard full", "fsdp --shard grad", "multi-worker-mirrored --check-sync 2"}) {
    const RunResult run = runKolo("run -n 2 -- " + kolo() + lm + file("fsdp.safetensors") + " --strategy " + strategy);
    ASSERT_EQ(run.exitCode, 0) << run.output;
    EXPECT_NE(run.output.find(strategy.substr(0, strategy.find(' ')) + " ranks 2"), std::string::npos) << run.output;
    expectClose(file("dp.safetensors"), file("fsdp.safetensors"), 1e-5, strategy);
  }
}

// lm checkpoints under fsdp are the file the other lm layouts write: a run stopped after its
// checkpoint of step 3 continues to the weights of an uninterrupted 6-step run, exactly on the
// same ranks (AdamW, ZeRO-3 and ZeRO-2), and within rounding (SGD with momentum, linear in the
// gradient) on 4 ranks under HSDP, on one rank, in a pipeline, and from a tensor-parallel run's.
TEST_F(TrainFsdpTest, LanguageModelCheckpointsResumeInAnyLayout) {
  {
    std::ofstream text(file("text.txt"));
    for (int i = 0; i < 40; ++i) text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const std::string run2 = "run -n 2 -- " + kolo(), run4 = "run -n 4 -- " + kolo();
  auto lm = [&](const std::string& optimizer) {
    return " train --model lm --data " + file("text.txt") +
           " --layers 2 --d-model 16 --heads 2 --seq-len 8 --batch 8 " + optimizer +
           " --sample-bytes 16 --threads 1 --quiet --steps 6";
  };
  // Stops a run after its checkpoint of step 3; returns the checkpoint directory.
  int stops = 0;
  auto stopped = [&](const std::string& writer) {
    const std::string dir = file("ck" + std::to_string(stops++));
    const RunResult run = runKolo(writer + " --checkpoint-dir " + dir + " --checkpoint-every 3 --fail-at-step 4");
    EXPECT_NE(run.exitCode, 0) << writer << "\n" << run.output;
    EXPECT_TRUE(fs::exists(fs::path(dir) / "ckpt-000000003")) << writer << "\n" << run.output;
    return dir;
  };
  // Continues from `dir`'s checkpoint of step 3, writing its own elsewhere (so that `dir` still
  // ends at step 3 for the next reader).
  int resumes = 0;
  auto resume = [&](const std::string& reader, const std::string& dir) {
    const RunResult run = runKolo(reader + " --resume " + dir + " --checkpoint-dir " +
                                  file("continued" + std::to_string(resumes++)) + " --save " +
                                  file("resumed.safetensors"));
    ASSERT_EQ(run.exitCode, 0) << reader << "\n" << run.output;
    EXPECT_NE(run.output.find("ckpt-000000003 step=3"), std::string::npos) << reader << "\n" << run.output;
  };

  const std::string adam = lm("--optimizer adamw --lr 0.01");
  for (const char* shard : {"full", "grad"}) {
    const std::string fsdp = run2 + adam + " --strategy fsdp --shard " + shard;
    ASSERT_EQ(runKolo(fsdp + " --save " + file("straight.safetensors")).exitCode, 0) << shard;
    const std::string dir = stopped(fsdp);
    // Whole tensors under the model's names, as the uninterrupted run saves them.
    const Weights saved = loadWeights(dir + "/ckpt-000000003/model.safetensors");
    const Weights names = loadWeights(file("straight.safetensors"));
    ASSERT_EQ(saved.size(), names.size()) << shard;
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_EQ(saved[i].first, names[i].first) << shard;
      EXPECT_EQ(saved[i].second.size(), names[i].second.size()) << shard << " " << saved[i].first;
    }
    resume(fsdp, dir);
    expectClose(file("straight.safetensors"), file("resumed.safetensors"), 0.0,
                std::string("AdamW --shard ") + shard + ", 2 -> 2 ranks");
  }

  const std::string sgd = lm("--optimizer sgd --lr 0.1 --momentum 0.9");
  ASSERT_EQ(runKolo(sgd + " --save " + file("straight.safetensors")).exitCode, 0);
  const std::string fromFsdp = stopped(run2 + sgd + " --strategy fsdp --shard full");
  struct Reader {
    std::string name, command;
  };
  for (const Reader& r : {Reader{"fsdp 2 ranks -> HSDP on 4", run4 + sgd + " --strategy fsdp --shard grad --shard-group 2"},
                          Reader{"fsdp 2 ranks -> one rank", sgd},
                          Reader{"fsdp 2 ranks -> pipeline", run2 + sgd + " --strategy pipeline --stages 2 --micro-batches 2"}}) {
    resume(r.command, fromFsdp);
    expectClose(file("straight.safetensors"), file("resumed.safetensors"), 1e-5, r.name);
  }
  resume(run2 + sgd + " --strategy fsdp --shard grad", stopped(run2 + sgd + " --strategy tensor --tp 2"));
  expectClose(file("straight.safetensors"), file("resumed.safetensors"), 1e-5, "tensor -> fsdp 2 ranks");
}

TEST_F(TrainFsdpTest, RefusesWhatFsdpDoesNotTake) {
  const RunResult sync = runKolo("train --model mlp --workers 2 --strategy fsdp --steps 1 --check-sync 2");
  EXPECT_NE(sync.exitCode, 0);
  EXPECT_NE(sync.output.find("--check-sync"), std::string::npos) << sync.output;
  const RunResult group = runKolo("train --model mlp --shard-group 2 --steps 1");
  EXPECT_NE(group.exitCode, 0);
  EXPECT_NE(group.output.find("--shard-group applies to --strategy fsdp, not to --strategy one-device"),
            std::string::npos)
      << group.output;
  const RunResult units = runKolo("train --model mlp --unit-params 1000 --steps 1");
  EXPECT_NE(units.exitCode, 0);
  EXPECT_NE(units.output.find("--unit-params applies to --strategy fsdp"), std::string::npos)
      << units.output;
  const RunResult shard = runKolo("train --model mlp --strategy fsdp --shard zero3 --steps 1");
  EXPECT_NE(shard.exitCode, 0);
  EXPECT_NE(shard.output.find("--shard"), std::string::npos) << shard.output;
}

// The flags of the data-parallel reducers are refused, by name, where no reducer would read
// them (they were ignored before): fsdp, the model-parallel runner, parameter servers and
// federated training. Each case: the command line, the start of the message.
TEST_F(TrainFsdpTest, ReducerFlagsAreRefusedWhereNoReducerReadsThem) {
  const std::string reducer = " applies to --strategy mirrored or multi-worker-mirrored, not to ";
  const std::string mwm = " applies to --strategy multi-worker-mirrored, not to ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model mlp --workers 2 --steps 1 --strategy fsdp --overlap on",
       "--overlap" + reducer + "--strategy fsdp"},
      {"--model mlp --workers 2 --steps 1 --strategy fsdp --shard-optimizer off --bucket-mb 5",
       "--bucket-mb" + reducer + "--strategy fsdp"},
      {"--model mlp --steps 1 --strategy pipeline --compress fp16",
       "--compress" + mwm + "--strategy pipeline"},
      {"--model mlp --steps 1 --strategy tensor --balance", "--balance" + mwm + "--strategy tensor"},
      {"--model lm --steps 1 --overlap auto --first-bucket-mb 2",
       "--first-bucket-mb" + reducer + "--strategy one-device"},
      {"--model mlp --strategy federated --shard-optimizer on",
       "--shard-optimizer" + reducer + "--strategy federated"},
      {"--model mlp --strategy parameter-server --bucket-mb 4",
       "--bucket-mb" + reducer + "--strategy parameter-server"}};
  for (const auto& [flags, message] : cases) {
    const RunResult r = runKolo("train " + flags);
    EXPECT_NE(r.exitCode, 0) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

}  // namespace
