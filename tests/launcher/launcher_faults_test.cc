// `kolo run` under faults, end to end with the real binary: a SIGKILLed launcher (plain
// `kolo run` with shell ranks, `kolo train --workers 2`, which re-launches itself through
// it, and `kolo bench --ranks 2`) leaves no rank and no child of a rank running; a training rank killed by
// SIGKILL while its peer trains ends the job non-zero, naming that rank, under every
// strategy of `kolo train` that runs ranks in step (--debug-kill-rank: the rank kills
// itself mid-run), with no name of kolo's left in /dev/shm.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "launcher/process_helpers.h"
#include "support/fashion_mnist.h"

namespace kolo {
namespace {

using namespace kolo::testing;
using namespace std::chrono_literals;

const std::string kKolo = KOLO_BINARY_DIR "/src/cli/kolo";

/// Generous limit for processes to vanish after their launcher died: a liveness check, not
/// a measure of speed (the kernel delivers the death signal at once).
constexpr auto kGoneWithin = 20s;

/// The launcher's rank processes by rank, once `count` of them have exec'd.
std::map<int, pid_t> ranksOf(pid_t launcher, int count) {
  std::map<int, pid_t> ranks;
  waitFor([&] {
    ranks.clear();
    for (pid_t child : childrenOf(launcher))
      if (int rank = rankOf(child); rank >= 0) ranks[rank] = child;
    return static_cast<int>(ranks.size()) == count;
  });
  return ranks;
}

class LauncherFaultsTest : public TempDirTest {
 protected:
  /// `kolo train --workers 2` on a small slice of Fashion-MNIST for (practically) ever;
  /// returns once rank 0 has written the first epoch's metrics, i.e. both ranks train.
  Child startEndlessTraining() {
    const std::string metrics = dir_ + "/metrics.jsonl";
    Child launcher =
        spawnChild({kKolo, "train", "--workers", "2", "--model", "mlp", "--train-limit", "640",
                    "--batch", "64", "--epochs", "100000", "--quiet", "--metrics", metrics},
                   cleanEnvironment());
    EXPECT_GT(launcher.pid, 0);
    EXPECT_TRUE(
        waitFor([&] { return !readFile(metrics).empty() || processGone(launcher.pid); }, 120s))
        << "no metrics from the training job";
    EXPECT_FALSE(processGone(launcher.pid)) << "the training job ended early";
    return launcher;
  }
};

/// SIGKILLs the launcher and expects every process in `pids` gone within kGoneWithin.
void killLauncherAndExpectGone(Child& launcher, const std::vector<pid_t>& pids) {
  ::kill(launcher.pid, SIGKILL);
  Result r = collect(launcher);
  ASSERT_TRUE(WIFSIGNALED(r.status));
  for (pid_t pid : pids)
    EXPECT_TRUE(waitFor([&] { return processGone(pid); }, kGoneWithin))
        << "pid " << pid << " outlived its SIGKILLed launcher";
}

TEST_F(LauncherFaultsTest, SigkilledLauncherLeavesNoRankBehind) {
  // Each rank (a shell) starts a long sleep in the background, writes both pids and waits.
  const std::string script = sleepingRankScript(dir_, 300);
  Child launcher = spawnChild({kKolo, "run", "-n", "2", "--grace", "30", "--", "sh", "-c", script},
                              cleanEnvironment());
  ASSERT_GT(launcher.pid, 0);
  const std::vector<std::string> names = {"/pid.0", "/pid.1", "/child.0", "/child.1"};
  ASSERT_TRUE(waitFor([&] {
    for (const auto& name : names)
      if (!std::filesystem::exists(dir_ + name)) return false;
    return true;
  }));
  std::set<pid_t> unique;
  for (const auto& name : names) unique.insert(std::stoi(readFile(dir_ + name)));
  // Everything the launcher started (the two ranks, already listed, and its guard) too.
  for (pid_t child : childrenOf(launcher.pid)) unique.insert(child);
  EXPECT_EQ(unique.size(), 5u);
  const std::vector<pid_t> pids(unique.begin(), unique.end());
  for (pid_t pid : pids) ASSERT_FALSE(processGone(pid)) << "pid " << pid << " ended too early";
  killLauncherAndExpectGone(launcher, pids);
}

TEST_F(LauncherFaultsTest, SigkilledTrainWorkersLeavesNoRankBehind) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  Child launcher = startEndlessTraining();
  ASSERT_FALSE(processGone(launcher.pid));
  const std::map<int, pid_t> ranks = ranksOf(launcher.pid, 2);
  ASSERT_EQ(ranks.size(), 2u);
  std::vector<pid_t> pids = childrenOf(launcher.pid);  // the ranks and the guard
  EXPECT_EQ(pids.size(), 3u);
  killLauncherAndExpectGone(launcher, pids);
}

TEST_F(LauncherFaultsTest, SigkilledBenchLeavesNoRankBehind) {
  // `kolo bench --ranks 2` forks its ranks itself (comm::spawn); a long sweep keeps them busy.
  // A process killed by SIGKILL cannot remove its ranks' store directory, so it makes that
  // under a TMPDIR of the test's own.
  char tmpdir[] = "/tmp/kolo-bench-faults-XXXXXX";
  ASSERT_NE(mkdtemp(tmpdir), nullptr);
  Child bench = spawnChild({kKolo, "bench", "allreduce", "--ranks", "2", "-b", "1M", "-e", "1M",
                            "-n", "100000000"},
                           cleanEnvironment({{"TMPDIR", tmpdir}}));
  ASSERT_GT(bench.pid, 0);
  std::vector<pid_t> ranks;
  ASSERT_TRUE(waitFor([&] {
    ranks = childrenOf(bench.pid);
    return ranks.size() == 2;
  }));
  killLauncherAndExpectGone(bench, ranks);
  std::filesystem::remove_all(tmpdir);
}

TEST_F(LauncherFaultsTest, RankKilledWhileItsPeerTrainsIsNamed) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  Child launcher = startEndlessTraining();
  ASSERT_FALSE(processGone(launcher.pid));
  const std::map<int, pid_t> ranks = ranksOf(launcher.pid, 2);
  ASSERT_EQ(ranks.size(), 2u);
  const pid_t victim = ranks.at(1);
  ::kill(victim, SIGKILL);
  Result r = collect(launcher);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.err;
  EXPECT_EQ(r.exitCode(), 128 + SIGKILL) << r.err;
  EXPECT_NE(
      r.err.find("rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9 (SIGKILL)"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("rank 0 (pid"), std::string::npos) << r.err;  // its peer is not blamed
  EXPECT_TRUE(waitFor([&] { return processGone(ranks.at(0)); }, kGoneWithin));
}

TEST_F(LauncherFaultsTest, RankKillingItselfMidRunIsNamedUnderEveryStrategy) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  for (const std::vector<std::string>& strategy :
       std::vector<std::vector<std::string>>{{"--strategy", "multi-worker-mirrored"},
                                             {"--strategy", "fsdp", "--shard", "full"},
                                             {"--strategy", "pipeline", "--stages", "2"}}) {
    std::vector<std::string> args = {kKolo, "run", "-n", "2", "--", kKolo, "train", "--model",
                                     "mlp", "--train-limit", "640", "--batch", "64",
                                     "--epochs", "3", "--threads", "1", "--quiet",
                                     "--debug-kill-rank", "1:4"};
    args.insert(args.end(), strategy.begin(), strategy.end());
    const Result r = runProgram(args, cleanEnvironment());
    const std::string what = strategy[1];
    EXPECT_EQ(r.exitCode(), 128 + SIGKILL) << what << "\n" << r.err;
    EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << what << "\n" << r.err;
    EXPECT_NE(r.err.find("was killed by signal 9 (SIGKILL)"), std::string::npos)
        << what << "\n" << r.err;
    EXPECT_EQ(r.err.find("rank 0 (pid"), std::string::npos) << what << "\n" << r.err;
    EXPECT_TRUE(koloNamesInDevShm().empty()) << what;
  }
}

}  // namespace
}  // namespace kolo
