// End-to-end numeric checks of `kolo train` on two ranks (real processes): a NaN injected
// into one module's output on one rank stops the job naming that rank, step and module
// (exit 4); one weight changed by hand on one rank is found by --check-sync, naming the
// rank and the tensor (exit 7); the steps before each injection pass the checks. (The
// library tests in tests/observe cover gradients, more ranks and clean runs.)
#include <gtest/gtest.h>

#include <string>

#include "run_kolo.h"
#include "support/fashion_mnist.h"

namespace {

using kolo::testing::RunResult;
using kolo::testing::runKolo;

const std::string kTrain =
    "train --workers 2 --model mlp --batch 64 --optimizer sgd --lr 0.05 --train-limit 2048 "
    "--steps 16 --quiet ";

TEST(NumericsCliTest, DetectAnomalyNamesTheRankStepAndModuleOfAnInjectedNan) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  // Module 2 is the middle Linear; every later module's output holds the NaN too, and the
  // loss on both ranks, but the first finding is rank 1's module 2 at step 6.
  const RunResult run = runKolo(kTrain + "--detect-anomaly --debug-nan-at 6:1:2");
  EXPECT_EQ(run.exitCode, 4) << run.output;
  const std::string expected =
      "kolo: error: non-finite values: rank 1, step 6: the forward output of module '2' "
      "(Linear) holds 1 NaN and 0 infinite value(s) (the first at element 0)";
  // Both ranks find it together and either may print it first; the launcher then stops the
  // other, which may not have printed yet. Whatever rank printed, it said the same.
  const std::string prefix = "kolo: error: non-finite values";
  int found = 0;
  for (size_t at = run.output.find(prefix); at != std::string::npos;
       at = run.output.find(prefix, at + 1)) {
    EXPECT_EQ(run.output.compare(at, expected.size(), expected), 0) << run.output;
    ++found;
  }
  EXPECT_GE(found, 1) << run.output;
}

TEST(NumericsCliTest, CheckSyncNamesTheRankWhoseWeightWasChangedByHand) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  // Checks after steps 5, 10, 15; the change lands before step 7, so the check after step 5
  // passes and the one after step 10 finds it.
  const RunResult run =
      runKolo(kTrain + "--check-sync 5 --shard-optimizer off --debug-perturb 7:1:2.weight");
  EXPECT_EQ(run.exitCode, 7) << run.output;
  EXPECT_NE(run.output.find("kolo: error: weights out of sync at step 10: rank 1 differs from "
                            "rank 0 in 1 of 6 tensors, the first '2.weight'"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("at step 5"), std::string::npos) << run.output;
}

TEST(NumericsCliTest, CheckSyncOnOneProcessIsRejected) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const RunResult oneRank = runKolo("train --model mlp --steps 2 --check-sync 1 --quiet");
  EXPECT_EQ(oneRank.exitCode, 2) << oneRank.output;
  EXPECT_NE(oneRank.output.find("--check-sync applies to --strategy multi-worker-mirrored, not to --strategy one-device: it compares the weights of several ranks"),
            std::string::npos)
      << oneRank.output;
}

}  // namespace
