// The kill matrix: `kolo run -n 3` running all-reduces over shared memory, and one process
// of the job (the launcher or any rank, in turn) SIGKILLed at a random moment of
// rendezvous or of a collective, 50 times. Afterwards every process of the job is gone and
// /dev/shm holds nothing of kolo's: shared memory never has a name to leave behind.
#include <signal.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "launcher/process_helpers.h"

namespace kolo {
namespace {

using namespace std::chrono_literals;
using namespace kolo::testing;

const std::string kKolo = KOLO_BINARY_DIR "/src/cli/kolo";
constexpr int kRanks = 3;
constexpr int kRounds = 50;

TEST(SharedMemoryKillMatrix, NothingOutlivesAKilledProcess) {
  const std::set<std::string> before = koloNamesInDevShm();
  std::mt19937 random(20261123);
  std::map<std::string, int> killed;  // victim kind -> rounds
  for (int round = 0; round < kRounds; ++round) {
    // Victims in turn: the launcher, then each rank (rank 0 creates the host's block).
    const int victim = round % (kRanks + 1) - 1;  // -1: the launcher
    // A moment from the first milliseconds (rendezvous) to well inside the sweep.
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 300000)(random));
    SCOPED_TRACE("round " + std::to_string(round) + ", victim " +
                 (victim < 0 ? std::string("launcher") : "rank " + std::to_string(victim)) + ", after " +
                 std::to_string(delay.count()) + " us");
    Child launcher = spawnChild({kKolo, "run", "-n", std::to_string(kRanks), "--grace", "5", "--", kKolo, "bench",
                                 "allreduce", "-b", "4K", "-e", "4M", "-f", "4", "-n", "1000000"},
                                cleanEnvironment());
    ASSERT_GT(launcher.pid, 0);
    // Every process of the job seen so far, to check afterwards that all are gone. A rank
    // victim is killed `delay` after it has started, the launcher `delay` after its own start.
    std::set<pid_t> job = {launcher.pid};
    pid_t target = launcher.pid;
    if (victim >= 0) {
      ASSERT_TRUE(waitFor([&] {
        for (pid_t child : childrenOf(launcher.pid))
          if (rankOf(child) == victim) target = child;
        return target != launcher.pid;
      })) << "rank " << victim << " never started";
    }
    std::this_thread::sleep_for(delay);
    for (pid_t child : childrenOf(launcher.pid)) job.insert(child);
    ::kill(target, SIGKILL);
    killed[victim < 0 ? "launcher" : "rank " + std::to_string(victim)]++;
    Result result = collect(launcher);
    EXPECT_TRUE(WIFSIGNALED(result.status) || result.exitCode() != 0)
        << "the job ended cleanly although a process was killed\n"
        << result.err;
    for (pid_t pid : job)
      EXPECT_TRUE(waitFor([&] { return processGone(pid); }, 30s)) << "pid " << pid << " outlived the job";
    EXPECT_EQ(koloNamesInDevShm(), before) << "a name in /dev/shm outlived the job";
  }
  std::string summary;
  for (const auto& [who, count] : killed) summary += " " + who + ": " + std::to_string(count);
  std::printf("SIGKILLed in %d rounds:%s\n", kRounds, summary.c_str());
}

}  // namespace
}  // namespace kolo
