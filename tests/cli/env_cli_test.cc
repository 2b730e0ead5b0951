// End-to-end tests of `kolo env` and of what `kolo` says about settings and user mistakes:
// the listing with values and sources, the warning for a misspelt KOLO_* variable, a bad
// KOLO_* value, option ranges in a user's words, and the exit codes of docs/exit_codes.md.
// Every run gets a controlled environment (env -i), so the caller's KOLO_* variables do not
// leak in.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "cli/library_words.h"
#include "kolo/exit_codes.h"
#include "kolo/data.h"
#include "kolo/error.h"
#include "kolo/settings.h"
#include "run_kolo.h"

namespace {

using kolo::testing::RunResult;
using kolo::testing::runKolo;

const std::string kClean = "env -i PATH=/usr/bin:/bin";

// The line of `kolo env` output that starts with `name` and a space.
std::string lineOf(const std::string& output, const std::string& name) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return line;
  }
  return "";
}

TEST(EnvCli, ListsEverySettingWithValueAndSource) {
  const RunResult run = runKolo("env", kClean + " KOLO_ALGO=ring KOLO_TOKEN=s3cret");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  for (const kolo::settings::Declaration& declaration : kolo::settings::declarations())
    EXPECT_NE(lineOf(run.output, std::string(declaration.name)), "") << declaration.name << "\n" << run.output;
  const std::string algo = lineOf(run.output, "KOLO_ALGO");
  EXPECT_NE(algo.find(" ring "), std::string::npos) << algo;
  EXPECT_NE(algo.find("environment"), std::string::npos) << algo;
  const std::string gemm = lineOf(run.output, "KOLO_SMALL_GEMM");
  EXPECT_NE(gemm.find(" 1 "), std::string::npos) << gemm;
  EXPECT_NE(gemm.find("default"), std::string::npos) << gemm;
  const std::string rank = lineOf(run.output, "KOLO_RANK");
  EXPECT_NE(rank.find("(unset)"), std::string::npos) << rank;
  EXPECT_EQ(run.output.find("s3cret"), std::string::npos) << "the token is shown:\n" << run.output;
  EXPECT_NE(lineOf(run.output, "KOLO_TOKEN").find("(set, hidden)"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("warning"), std::string::npos) << run.output;
}

TEST(EnvCli, UnknownVariableIsNamedOnceWithTheClosestSetting) {
  RunResult run = runKolo("env --brief", kClean + " KOLO_ALOG=ring");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const std::string warning =
      "kolo: warning: KOLO_ALOG is not a kolo setting (did you mean KOLO_ALGO?";
  EXPECT_NE(run.output.find(warning), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(warning), run.output.rfind(warning)) << "warned twice:\n" << run.output;
  // Other commands warn at startup, once.
  run = runKolo("bench nosuchcollective", kClean + " KOLO_WORLDSIZE=2");
  EXPECT_NE(run.output.find("KOLO_WORLDSIZE is not a kolo setting (did you mean KOLO_WORLD_SIZE?"),
            std::string::npos)
      << run.output;
}

TEST(EnvCli, BadSettingValueIsAUsageError) {
  RunResult run = runKolo("env", kClean + " KOLO_SMALL_GEMM=maybe");
  EXPECT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("not accepted: KOLO_SMALL_GEMM='maybe' is not a switch"), std::string::npos)
      << run.output;
  run = runKolo("train --steps 1", kClean + " KOLO_ALGO=fastest");
  EXPECT_EQ(run.exitCode, 2) << run.output;
  EXPECT_NE(run.output.find("kolo: error: KOLO_ALGO='fastest' is not accepted: use one of auto, ring"),
            std::string::npos)
      << run.output;
}

TEST(EnvCli, UserMistakesSayWhatIsAcceptedWithoutSourcePaths) {
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {
           Case{"train --batch 0", "kolo: error: --batch must be at least 1, got 0"},
           Case{"train --workers 0", "kolo: error: --workers must be at least 1, got 0"},
           Case{"train --model vgg", "kolo: error: --model 'vgg' is not accepted: use mlp, cnn, resnet or lm"},
           Case{"train --lr -1", "kolo: error: --lr must be above 0, got -1"},
           Case{"run -n 0 -- true", "kolo: error: --nproc-per-node must be at least 1, got 0"},
           Case{"train --batch many", "kolo: error: --batch must be a whole number, got 'many'"},
           Case{"bench allreduce -n 0", "kolo: error: kolo bench: -n/--iters must be at least 1, got 0"},
       }) {
    const RunResult run = runKolo(c.args, kClean);
    EXPECT_EQ(run.exitCode, 2) << c.args << "\n" << run.output;
    EXPECT_NE(run.output.find(c.message), std::string::npos) << c.args << "\n" << run.output;
    EXPECT_EQ(run.output.find(".cc:"), std::string::npos) << c.args << "\n" << run.output;
    EXPECT_EQ(run.output.find("check failed"), std::string::npos) << c.args << "\n" << run.output;
  }
}

TEST(EnvCli, ExitCodesFollowTheTable) {
  EXPECT_EQ(runKolo("--help", kClean).exitCode, 0);
  EXPECT_EQ(runKolo("", kClean).exitCode, 2);            // no subcommand
  EXPECT_EQ(runKolo("train --no-such-flag", kClean).exitCode, 2);
  const RunResult missing = runKolo("train --data /nonexistent/kolo-data --steps 1", kClean);
  EXPECT_EQ(missing.exitCode, 3) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent/kolo-data"), std::string::npos) << missing.output;
}

// A failed KOLO_CHECK is a bug, not a flag that is not accepted: its own kind (still an
// InvalidArgument for library callers that catch broken contracts so) and its own code.
TEST(EnvCli, AFailedCheckIsAnInternalErrorNotAUsageError) {
  const int two = 2;
  try {
    KOLO_CHECK_EQ(two, 3, "while testing");
    FAIL() << "KOLO_CHECK_EQ did not throw";
  } catch (const kolo::InternalError& e) {
    EXPECT_EQ(kolo::exitCodeFor(e), kolo::kExitCheckFailed);
    EXPECT_EQ(kolo::kExitCheckFailed, 8);
    EXPECT_NE(std::string(e.what()).find("check failed: two == 3 (2 vs 3)"), std::string::npos)
        << e.what();
    EXPECT_NE(dynamic_cast<const kolo::InvalidArgument*>(&e), nullptr);
  }
  EXPECT_EQ(kolo::exitCodeFor(kolo::InvalidArgument("--batch must be at least 1")),
            kolo::kExitUsage);
}

// The library names its own options; `kolo` prints the flags that set them, in one table.
TEST(EnvCli, LibraryOptionsAreShownAsTheirFlags) {
  using kolo::cli::inFlagWords;
  EXPECT_EQ(inFlagWords("FitOptions::batch 100 does not split evenly over 3 replicas"),
            "--batch 100 does not split evenly over 3 replicas");
  EXPECT_EQ(inFlagWords("FitOptions::resumeDir ck: no such directory"), "--resume ck: no such directory");
  EXPECT_EQ(inFlagWords("a batch (the batch must be a multiple of PipelineOptions::microBatches)"),
            "a batch (the batch must be a multiple of --micro-batches)");
  // Only whole names: a longer name, or one the table does not hold, stays as it is.
  EXPECT_EQ(inFlagWords("FitOptions::stepsDone and MyOptions::batch"),
            "FitOptions::stepsDone and MyOptions::batch");
  // The launcher the library names is the kolo run command that starts such a job.
  EXPECT_EQ(inFlagWords("KOLO_ROLE is not set (kolo's launcher of P servers and W workers sets it)"),
            "KOLO_ROLE is not set (kolo run --ps P --workers W sets it)");
  EXPECT_EQ(inFlagWords("set by kolo's launcher of an elastic job; KOLO_STORE is not set (kolo's launcher sets it)"),
            "set by kolo run --elastic; KOLO_STORE is not set (kolo run sets it)");
  EXPECT_EQ(inFlagWords("parseCompressSpec topk:2: FRACTION ..."), "--compress topk:2: FRACTION ...");
}

TEST(EnvCli, DivergedRunExitsWithItsOwnCode) {
  if (!std::filesystem::exists(std::string(kolo::data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const RunResult run = runKolo(
      "train --model mlp --train-limit 256 --steps 3 --batch 64 --optimizer sgd --lr 1e30 --quiet",
      kClean);
  EXPECT_EQ(run.exitCode, 4) << run.output;
  EXPECT_NE(run.output.find("kolo: error: training diverged: loss"), std::string::npos) << run.output;
  const RunResult badInit = runKolo("train --model mlp --steps 1 --quiet --init /etc/hostname", kClean);
  EXPECT_EQ(badInit.exitCode, 3) << badInit.output;
  const RunResult noInit = runKolo("train --model mlp --steps 1 --quiet --init /nonexistent.safetensors", kClean);
  EXPECT_EQ(noInit.exitCode, 3) << noInit.output;
}

}  // namespace
