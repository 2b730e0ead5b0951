// comm::spawn: every rank gets a connected communicator and its value comes back; a rank
// that throws, exits or is killed is named in the caller's exception with what happened,
// and its siblings are stopped (ranks that would otherwise wait forever, so a call that
// returns at all shows it); nothing is left in TMPDIR or /dev/shm, and a directory left by a
// caller killed with SIGKILL is removed by the next call; one rank works; fewer than one is
// refused.
#include "kolo/comm/spawn.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "kolo/error.h"

namespace kolo::comm {
namespace {

namespace fs = std::filesystem;

std::set<std::string> koloShmNames() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("kolo", 0) == 0) names.insert(name);
  }
  return names;
}

int allowedCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return CPU_COUNT(&set);
}

// Blocks until a signal ends the process: a rank that only spawn's stop can end.
[[noreturn]] void waitForever() {
  for (;;) pause();
}

/// Each test runs with TMPDIR set to a fresh directory, which must be empty afterwards (the
/// store directory removed), and must leave no new /dev/shm/kolo* name behind.
class Spawn : public ::testing::Test {
 protected:
  void SetUp() override {
    shmBefore_ = koloShmNames();
    char pattern[] = "/tmp/kolo-spawn-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    tmp_ = pattern;
    if (const char* old = std::getenv("TMPDIR")) oldTmp_ = old;
    setenv("TMPDIR", tmp_.c_str(), 1);
  }

  void TearDown() override {
    if (oldTmp_.empty()) {
      unsetenv("TMPDIR");
    } else {
      setenv("TMPDIR", oldTmp_.c_str(), 1);
    }
    EXPECT_TRUE(fs::is_empty(tmp_))
        << "left in " << tmp_ << ": " << fs::directory_iterator(tmp_)->path();
    fs::remove_all(tmp_);
    for (const std::string& name : koloShmNames())
      EXPECT_TRUE(shmBefore_.count(name)) << "left /dev/shm/" << name;
  }

  const std::string& tmp() const { return tmp_; }

  // Long enough that a test passing never depends on a deadline.
  SpawnOptions patient() const {
    SpawnOptions options;
    options.native.timeout = std::chrono::minutes(10);
    return options;
  }

 private:
  std::string tmp_;
  std::string oldTmp_;
  std::set<std::string> shmBefore_;
};

class SpawnSizes : public Spawn, public ::testing::WithParamInterface<int> {};

TEST_P(SpawnSizes, EveryRankAllReducesTheRanksAndItsValueComesBack) {
  const int n = GetParam();
  const std::vector<int> values = spawn(n, [](std::shared_ptr<Communicator> comm) {
    int32_t sum = comm->rank();
    comm->allreduce(&sum, &sum, 1, DType::I32, ReduceOp::Sum);
    // Both the all-reduced sum and who computed it travel back to the parent.
    return comm->size() * 10000 + sum * 100 + comm->rank();
  });
  const int expectedSum = n * (n - 1) / 2;
  ASSERT_EQ(values.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(values[r], n * 10000 + expectedSum * 100 + r) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, SpawnSizes, ::testing::Values(1, 2, 3, 4));

TEST_F(Spawn, CoreBindingGivesEachRankOneCpuAndNoneLeavesTheMask) {
  const int parentCpus = allowedCpuCount();
  const RankFunction countCpus = [](std::shared_ptr<Communicator>) { return allowedCpuCount(); };
  SpawnOptions options;
  options.bind = CpuBinding::Core;
  EXPECT_EQ(spawn(2, countCpus, options), (std::vector<int>{1, 1}));
  options.bind = CpuBinding::None;
  EXPECT_EQ(spawn(2, countCpus, options), (std::vector<int>{parentCpus, parentCpus}));
  // A single rank is never bound.
  options.bind = CpuBinding::Core;
  EXPECT_EQ(spawn(1, countCpus, options), std::vector<int>{parentCpus});
}

TEST_F(Spawn, AThrowingRankIsNamedWithItsMessageAndItsSiblingsAreStopped) {
  try {
    spawn(
        3,
        [](std::shared_ptr<Communicator> comm) -> int {
          if (comm->rank() == 1) KOLO_THROW(InvalidArgument, "rank one gave up on purpose");
          waitForever();
        },
        patient());
    FAIL() << "spawn returned although rank 1 threw";
  } catch (const PeerError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 of 3 failed: kolo::InvalidArgument: rank one gave up on purpose"),
              std::string::npos)
        << what;
    // The siblings ended by spawn's SIGTERM are stopped, not failed.
    EXPECT_EQ(what.find("also failed"), std::string::npos) << what;
  }
}

TEST_F(Spawn, ARankKilledBySigkillIsNamedWithItsSignalRatherThanThePeersThatLostIt) {
  try {
    spawn(
        3,
        [](std::shared_ptr<Communicator> comm) -> int {
          comm->barrier();
          if (comm->rank() == 2) kill(getpid(), SIGKILL);
          comm->barrier();  // never completes: rank 2 is gone
          return 0;
        },
        patient());
    FAIL() << "spawn returned although rank 2 was killed";
  } catch (const PeerError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("rank 2 of 3 died of signal 9 (SIGKILL)", 0), 0u) << what;
  }
}

TEST_F(Spawn, APeerErrorIsNamedAfterAFailureOfARanksOwnAndBothAreListed) {
  // Rank 0 reports a lost peer first; rank 1 fails for a reason of its own once spawn's stop
  // reaches it (it holds SIGTERM back, from before the barrier, to see it).
  try {
    spawn(2, [](std::shared_ptr<Communicator> comm) -> int {
      sigset_t term;
      sigemptyset(&term);
      sigaddset(&term, SIGTERM);
      if (comm->rank() == 1) sigprocmask(SIG_BLOCK, &term, nullptr);
      comm->barrier();
      if (comm->rank() == 0) KOLO_THROW(PeerError, "lost my peer");
      int sig = 0;
      sigwait(&term, &sig);
      KOLO_THROW(Timeout, "my own deadline");
    });
    FAIL() << "spawn returned although both ranks threw";
  } catch (const PeerError& e) {
    EXPECT_EQ(std::string(e.what()),
              "rank 1 of 2 failed: kolo::Timeout: my own deadline; also failed: rank 0 "
              "(kolo::PeerError)");
  }
}

TEST_F(Spawn, ARankThatExitsIsNamedWithItsStatusAndStatusZeroCountsAsReturningZero) {
  try {
    spawn(2, [](std::shared_ptr<Communicator> comm) -> int {
      if (comm->rank() == 1) _exit(7);
      waitForever();
    });
    FAIL() << "spawn returned although rank 1 exited with status 7";
  } catch (const PeerError& e) {
    EXPECT_NE(
        std::string(e.what()).find("rank 1 of 2 exited with status 7 before its function returned"),
        std::string::npos)
        << e.what();
  }
  const std::vector<int> values = spawn(2, [](std::shared_ptr<Communicator> comm) -> int {
    if (comm->rank() == 0) _exit(0);
    return 5;
  });
  EXPECT_EQ(values, (std::vector<int>{0, 5}));
}

TEST_F(Spawn, NonZeroValuesAreResultsNotFailures) {
  EXPECT_EQ(spawn(3, [](std::shared_ptr<Communicator> comm) { return 3 - comm->rank(); }),
            (std::vector<int>{3, 2, 1}));
}

TEST_F(Spawn, AStoreDirectoryLeftByAKilledCallerIsRemovedByTheNextCall) {
  // A caller SIGKILLed while its ranks run: its ranks die with it, its directory stays.
  const pid_t caller = fork();
  ASSERT_GE(caller, 0);
  if (caller == 0) {
    spawn(2, [](std::shared_ptr<Communicator>) -> int { waitForever(); });
    _exit(0);
  }
  const std::string prefix = "kolo-spawn-" + std::to_string(caller) + "-";
  fs::path left;
  for (int i = 0; i < 2000 && left.empty(); ++i) {
    for (const auto& entry : fs::directory_iterator(tmp()))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) left = entry.path();
    if (left.empty()) usleep(5000);
  }
  ASSERT_FALSE(left.empty()) << "the caller made no store directory in " << tmp();
  kill(caller, SIGKILL);
  ASSERT_EQ(waitpid(caller, nullptr, 0), caller);
  EXPECT_TRUE(fs::exists(left));
  // The next call, here, removes it with its own.
  EXPECT_EQ(spawn(1, [](std::shared_ptr<Communicator>) { return 7; }), std::vector<int>{7});
  EXPECT_FALSE(fs::exists(left)) << left;
}

TEST_F(Spawn, FewerThanOneRankOrNoFunctionIsRefused) {
  const RankFunction returnZero = [](std::shared_ptr<Communicator>) { return 0; };
  EXPECT_THROW(spawn(0, returnZero), InvalidArgument);
  EXPECT_THROW(spawn(-2, returnZero), InvalidArgument);
  EXPECT_THROW(spawn(2, RankFunction{}), InvalidArgument);
}

}  // namespace
}  // namespace kolo::comm
