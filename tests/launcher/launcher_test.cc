// `kolo run` end to end: the real binary starts shell programs (and launch_probe) as ranks;
// the tests check their variables, the rank prefix on every output line, that a failing
// rank or a signal to the launcher stops every rank, and a 2 nodes x 2 ranks job on
// loopback with a store hosted by node 0.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <regex>
#include <set>

#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "launcher/process_helpers.h"
#include "support/reserved_port.h"

namespace kolo {
namespace {

using namespace kolo::testing;
using namespace std::chrono_literals;

const std::string kKolo = KOLO_BINARY_DIR "/src/cli/kolo";
const std::string kProbe = KOLO_LAUNCH_PROBE;

class LauncherTest : public TempDirTest {
 protected:
  Result kolo(std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) {
    args.insert(args.begin(), kKolo);
    return runProgram(args, cleanEnvironment(env));
  }

  /// The pids the ranks wrote to dir_/NAME.R, once all `count` files exist.
  std::vector<pid_t> pidsFromFiles(const std::string& name, int count) {
    std::vector<pid_t> pids;
    EXPECT_TRUE(waitFor([&] {
      for (int r = 0; r < count; ++r)
        if (!std::filesystem::exists(dir_ + "/" + name + "." + std::to_string(r))) return false;
      return true;
    }));
    for (int r = 0; r < count; ++r)
      pids.push_back(std::stoi(readFile(dir_ + "/" + name + "." + std::to_string(r))));
    return pids;
  }

};

/// Starts node 0's launcher (`args` after the store address) with its store on a reserved
/// loopback port and returns once that store answers with `token`. A launcher that lost its
/// reserved port to another process is started again on a fresh one (kReservedPortAttempts).
Child startNodeZero(const std::vector<std::string>& args, const std::string& token,
                    std::string* store) {
  for (int attempt = 1;; ++attempt) {
    const ReservedPort port;  // held until the launcher listens on it
    *store = port.address();
    std::vector<std::string> argv = {kKolo, "run",         "-n", "2",       "--nnodes",
                                     "2",   "--node-rank", "0",  "--store", *store};
    argv.insert(argv.end(), args.begin(), args.end());
    Child node0 = spawnChild(argv, cleanEnvironment({{"KOLO_TOKEN", token}}));
    const bool up = waitFor([&] {
      if (processGone(node0.pid)) return true;
      try {
        comm::connectTcpStore(*store, token, 100ms);
        return true;
      } catch (const Error&) {
        return false;
      }
    });
    if (up && !processGone(node0.pid)) return node0;
    if (!up) ::kill(node0.pid, SIGKILL);
    const Result r = collect(node0);
    if (up && lostReservedPort(r.err) && attempt < kReservedPortAttempts) continue;
    ADD_FAILURE() << "node 0's launcher did not host the store on " << *store << ": " << r.err;
    return Child{};
  }
}

/// Node 1 of a two-node job of 2 ranks a node: `kolo run ... --node-rank 1 --store STORE`
/// followed by `args`.
Child startNodeOne(const std::vector<std::string>& args, const std::string& token, const std::string& store) {
  std::vector<std::string> argv = {kKolo, "run", "-n", "2", "--nnodes", "2", "--node-rank", "1", "--store", store};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawnChild(argv, cleanEnvironment({{"KOLO_TOKEN", token}}));
}

TEST_F(LauncherTest, ThreeRanksGetTheirVariables) {
  Result r =
      kolo({"run", "-n", "3", "--timeout", "42", "--", "sh", "-c",
            "echo \"$KOLO_RANK $KOLO_WORLD_SIZE $KOLO_LOCAL_RANK $KOLO_LOCAL_SIZE $KOLO_NODE_RANK "
            "$KOLO_STORE $KOLO_TOKEN $KOLO_TIMEOUT\""});
  ASSERT_EQ(r.exitCode(), 0) << r.err;
  std::regex line(R"(\[rank (\d)\] (\d) 3 (\d) 3 0 (127\.0\.0\.1:\d+) ([0-9a-f]{32}) 42)");
  std::set<int> ranks;
  std::set<std::string> stores, tokens;
  for (const auto& text : splitLines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, line)) << text;
    EXPECT_EQ(m[1], m[2]);
    EXPECT_EQ(m[2], m[3]);  // one node: local rank = rank
    ranks.insert(std::stoi(m[1]));
    stores.insert(m[4]);
    tokens.insert(m[5]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(stores.size(), 1u);
  EXPECT_EQ(tokens.size(), 1u);
}

TEST_F(LauncherTest, RanksStartWithMallocOnHugePagesUnlessToldOtherwise) {
  const std::vector<std::string> print = {"run", "-n", "2", "--", "sh", "-c", "echo \"<$GLIBC_TUNABLES>\""};
  const auto tunablesOf = [&](const std::map<std::string, std::string>& env) {
    const Result r = kolo(print, env);
    EXPECT_EQ(r.exitCode(), 0) << r.err;
    std::set<std::string> seen;
    for (const auto& line : splitLines(r.out)) seen.insert(line.substr(line.find('<')));
    EXPECT_EQ(seen.size(), 1u) << r.out;
    return seen.empty() ? std::string() : *seen.begin();
  };
  EXPECT_EQ(tunablesOf({}), "<glibc.malloc.hugetlb=1>");
  EXPECT_EQ(tunablesOf({{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"}}),
            "<glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1>");
  // The user's own choice of hugetlb stands, and KOLO_HUGE_PAGES=0 leaves the variable alone.
  EXPECT_EQ(tunablesOf({{"GLIBC_TUNABLES", "glibc.malloc.hugetlb=0"}}), "<glibc.malloc.hugetlb=0>");
  EXPECT_EQ(tunablesOf({{"KOLO_HUGE_PAGES", "0"}}), "<>");
  EXPECT_EQ(tunablesOf({{"KOLO_HUGE_PAGES", "0"}, {"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"}}),
            "<glibc.malloc.arena_max=2>");
}

TEST_F(LauncherTest, EveryOutputLineIsPrefixedAndWhole) {
  // Each rank writes two short lines, a 20000-byte line of its own digit, a stderr line
  // and a last line without newline; lines of different ranks must not mix.
  Result r =
      kolo({"run", "-n", "2", "sh", "-c",
            "echo first; echo second; head -c 20000 /dev/zero | tr '\\0' \"$KOLO_RANK\"; echo; "
            "echo oops >&2; printf 'no newline'"});
  ASSERT_EQ(r.exitCode(), 0) << r.err;
  auto out = splitLines(r.out);
  ASSERT_EQ(out.size(), 8u) << r.out.substr(0, 500);
  std::map<int, std::vector<std::string>> byRank;
  // Matched by hand: std::regex recurses per character and overflows the stack on the
  // 20000-byte lines under AddressSanitizer.
  const std::string head = "[rank ";
  for (const auto& text : out) {
    ASSERT_TRUE(text.size() >= head.size() + 3 && text.compare(0, head.size(), head) == 0 &&
                std::isdigit(static_cast<unsigned char>(text[head.size()])) && text[head.size() + 1] == ']' &&
                text[head.size() + 2] == ' ')
        << text.substr(0, 100);
    byRank[text[head.size()] - '0'].push_back(text.substr(head.size() + 3));
  }
  for (int rank : {0, 1}) {
    const auto& lines = byRank[rank];
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[0], "first");
    EXPECT_EQ(lines[1], "second");
    EXPECT_EQ(lines[2], std::string(20000, static_cast<char>('0' + rank)));
    EXPECT_EQ(lines[3], "no newline");
  }
  // The launcher's own lines (the ranks' pids at the start) are not the ranks'.
  std::multiset<std::string> errSet;
  for (const std::string& line : splitLines(r.err))
    if (line.rfind("kolo run: ", 0) != 0) errSet.insert(line);
  EXPECT_EQ(errSet, (std::multiset<std::string>{"[rank 0] oops", "[rank 1] oops"}));
  EXPECT_NE(r.err.find("kolo run: started 2 rank(s): rank 0 pid "), std::string::npos) << r.err;
}

TEST_F(LauncherTest, FailingRankStopsItsSiblingsAndIsNamed) {
  std::string script =
      "if [ \"$KOLO_RANK\" = 1 ]; then while [ ! -e " + dir_ + "/pid.0 ] || [ ! -e " + dir_ +
      "/pid.2 ]; do sleep 0.02; done; exit 3; fi; echo $$ > " + dir_ + "/tmp.$KOLO_RANK; mv " +
      dir_ + "/tmp.$KOLO_RANK " + dir_ + "/pid.$KOLO_RANK; exec sleep 120";
  Result r = kolo({"run", "-n", "3", "--", "sh", "-c", script});
  EXPECT_EQ(r.exitCode(), 3);
  EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with status 3"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 0 (pid"), std::string::npos) << r.err;  // stopped ranks are not blamed
  for (int rank : {0, 2}) {
    pid_t pid = std::stoi(readFile(dir_ + "/pid." + std::to_string(rank)));
    EXPECT_TRUE(processGone(pid)) << "rank " << rank << " pid " << pid;
  }
}

TEST_F(LauncherTest, RankKilledBySignalIsReported) {
  Result r = kolo({"run", "-n", "2", "--", "sh", "-c",
                   "if [ $KOLO_RANK = 0 ]; then kill -9 $$; fi; exec sleep 120"});
  EXPECT_EQ(r.exitCode(), 128 + SIGKILL);
  EXPECT_NE(r.err.find("rank 0 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
}

/// A rank that exits with "another rank failed" (5) is not blamed while the rank whose failure
/// it saw is still ending: here rank 1 exits 5 first, and rank 0 kills itself only once the
/// launcher has reaped rank 1 (its pid is gone). The launcher names rank 0.
TEST_F(LauncherTest, ARankEndingAfterItsPeerGaveUpIsStillTheOneBlamed) {
  const std::string script =
      "if [ $KOLO_RANK = 1 ]; then echo $$ > " + dir_ + "/tmp.1; mv " + dir_ + "/tmp.1 " + dir_ +
      "/pid.1; exit 5; fi; while [ ! -e " + dir_ + "/pid.1 ]; do sleep 0.01; done; "
      "peer=$(cat " + dir_ + "/pid.1); while kill -0 $peer 2>/dev/null; do sleep 0.01; done; "
      "kill -9 $$";
  Result r = kolo({"run", "-n", "2", "--", "sh", "-c", script});
  EXPECT_EQ(r.exitCode(), 128 + SIGKILL) << r.err;
  EXPECT_NE(r.err.find("rank 0 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
}

/// SIGTERM or SIGINT to the launcher reaches every rank and the children they started.
void expectSignalStopsEveryRank(const std::string& dir, int sig) {
  const std::string script = sleepingRankScript(dir, 120);
  Child launcher = spawnChild({kKolo, "run", "-n", "2", "--grace", "10", "--", "sh", "-c", script},
                              cleanEnvironment());
  ASSERT_GT(launcher.pid, 0);
  std::vector<pid_t> pids;
  ASSERT_TRUE(waitFor([&] {
    for (const char* name : {"/pid.0", "/pid.1", "/child.0", "/child.1"})
      if (!std::filesystem::exists(dir + name)) return false;
    return true;
  }));
  for (const char* name : {"/pid.0", "/pid.1", "/child.0", "/child.1"})
    pids.push_back(std::stoi(readFile(dir + name)));
  ::kill(launcher.pid, sig);
  Result r = collect(launcher);
  EXPECT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(r.exitCode(), 128 + sig) << r.err;
  EXPECT_NE(r.err.find(sig == SIGTERM ? "received SIGTERM" : "received SIGINT"), std::string::npos)
      << r.err;
  for (pid_t pid : pids)
    EXPECT_TRUE(waitFor([&] { return processGone(pid); }, 10s)) << "pid " << pid << " survived";
}

TEST_F(LauncherTest, SigtermToLauncherStopsEveryRank) { expectSignalStopsEveryRank(dir_, SIGTERM); }

TEST_F(LauncherTest, SigintToLauncherStopsEveryRank) { expectSignalStopsEveryRank(dir_, SIGINT); }

TEST_F(LauncherTest, RanksIgnoringSigtermAreKilledAfterGrace) {
  // Rank 0 ignores SIGTERM; rank 1 fails once rank 0 is up.
  std::string script = "trap '' TERM; if [ $KOLO_RANK = 1 ]; then while [ ! -e " + dir_ +
                       "/pid.0 ]; do sleep 0.02; done; exit 1; fi; echo $$ > " + dir_ +
                       "/tmp; mv " + dir_ + "/tmp " + dir_ + "/pid.0; while :; do sleep 0.05; done";
  Result r = kolo({"run", "-n", "2", "--grace", "0.3", "--", "sh", "-c", script});
  EXPECT_EQ(r.exitCode(), 1);
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
  ASSERT_TRUE(std::filesystem::exists(dir_ + "/pid.0"));
  EXPECT_TRUE(processGone(std::stoi(readFile(dir_ + "/pid.0"))));
}

TEST_F(LauncherTest, MissingProgramExits127) {
  Result r = kolo({"run", "-n", "2", "--", "/nonexistent/kolo-rank-program"});
  EXPECT_EQ(r.exitCode(), 127);
  EXPECT_NE(r.err.find("cannot start rank 0"), std::string::npos) << r.err;
}

TEST_F(LauncherTest, MultiNodeNeedsStoreAndSharedToken) {
  Result noStore = kolo({"run", "-n", "1", "--nnodes", "2", "--node-rank", "1", "--", "true"});
  EXPECT_NE(noStore.exitCode(), 0);
  EXPECT_NE(noStore.err.find("--store"), std::string::npos) << noStore.err;
  Result noToken = kolo({"run", "-n", "1", "--nnodes", "2", "--node-rank", "0", "--store",
                         "127.0.0.1:1", "--", "true"});
  EXPECT_NE(noToken.exitCode(), 0);
  EXPECT_NE(noToken.err.find("KOLO_TOKEN"), std::string::npos) << noToken.err;
  Result badRank = kolo(
      {"run", "-n", "1", "--nnodes", "2", "--node-rank", "2", "--store", "127.0.0.1:1", "true"});
  EXPECT_NE(badRank.exitCode(), 0);
}

/// Two launchers on loopback, 2 ranks each, node 0 hosting the store: every rank reaches
/// the store with the shared token and sees all four, node 1's ranks through their host
/// store (each rank says on stderr which store it was given).
TEST_F(LauncherTest, TwoNodesOfTwoRanksOnLoopback) {
  const std::string sayStore = std::string("echo \"store $KOLO_STORE\" >&2; exec ") + kProbe + " store";
  std::string store;
  Child node0 = startNodeZero({"--timeout", "60", "--", "sh", "-c", sayStore}, "shared-token-for-two-nodes", &store);
  ASSERT_GT(node0.pid, 0);
  Child node1 = startNodeOne({"--timeout", "60", "--", "sh", "-c", sayStore}, "shared-token-for-two-nodes", store);
  Result r0 = collect(node0);
  Result r1 = collect(node1);
  ASSERT_EQ(r0.exitCode(), 0) << r0.err;
  ASSERT_EQ(r1.exitCode(), 0) << r1.err;
  std::regex line(R"(\[rank (\d)\] probe rank=(\d) size=4 local=(\d)/2 launcher=kolo arrived=4)");
  std::map<int, int> localOf;
  for (const auto* out : {&r0.out, &r1.out}) {
    for (const auto& text : splitLines(*out)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(text, m, line)) << text;
      EXPECT_EQ(m[1], m[2]);
      localOf[std::stoi(m[2])] = std::stoi(m[3]);
    }
  }
  EXPECT_EQ(localOf, (std::map<int, int>{{0, 0}, {1, 1}, {2, 0}, {3, 1}}));
  EXPECT_NE(r0.out.find("[rank 0]"), std::string::npos);
  EXPECT_NE(r1.out.find("[rank 3]"), std::string::npos);
  // Node 0's ranks use the root; node 1's their host's store, which is not the root.
  EXPECT_NE(r0.err.find("[rank 1] store " + store + "\n"), std::string::npos) << r0.err;
  std::smatch hostStore;
  ASSERT_TRUE(std::regex_search(r1.err, hostStore, std::regex(R"(\[rank 3\] store (\S+))"))) << r1.err;
  EXPECT_NE(hostStore[1].str(), store);
  EXPECT_NE(r1.err.find("[rank 2] store " + hostStore[1].str()), std::string::npos) << r1.err;
}

TEST_F(LauncherTest, FailureOnOneNodeStopsTheOther) {
  // Rank 3 (node 1) fails once every other rank of both nodes is running.
  const std::string script = "if [ $KOLO_RANK = 3 ]; then while [ ! -e " + dir_ + "/up.0 ] || [ ! -e " + dir_ +
                             "/up.1 ] || [ ! -e " + dir_ + "/up.2 ]; do sleep 0.02; done; exit 5; fi; touch " +
                             dir_ + "/up.$KOLO_RANK; exec sleep 120";
  std::string store;
  Child node0 = startNodeZero({"--", "sh", "-c", script}, "tok", &store);
  ASSERT_GT(node0.pid, 0);
  Child node1 = startNodeOne({"--", "sh", "-c", script}, "tok", store);
  Result r1 = collect(node1);
  Result r0 = collect(node0);
  EXPECT_EQ(r1.exitCode(), 5) << r1.err;
  EXPECT_NE(r0.exitCode(), 0);
  EXPECT_NE(r0.err.find("rank 3"), std::string::npos) << r0.err;
}

// Node 0's launcher (the store's host) is SIGKILLed while every rank runs: node 1's launcher,
// whose watch for failures is parked at that store, stops its ranks and says why.
TEST_F(LauncherTest, LosingTheStoresNodeStopsTheOtherNode) {
  const std::string script = "touch " + dir_ + "/up.$KOLO_RANK; exec sleep 120";
  std::string store;
  Child node0 = startNodeZero({"--", "sh", "-c", script}, "tok", &store);
  ASSERT_GT(node0.pid, 0);
  Child node1 = startNodeOne({"--", "sh", "-c", script}, "tok", store);
  ASSERT_TRUE(waitFor([&] {
    for (int r = 0; r < 4; ++r)
      if (!std::filesystem::exists(dir_ + "/up." + std::to_string(r))) return false;
    return true;
  }));
  ::kill(node0.pid, SIGKILL);
  collect(node0);
  Result r1 = collect(node1);
  EXPECT_EQ(r1.exitCode(), 1) << r1.err;
  EXPECT_NE(r1.err.find("stopping the ranks of node 1: lost the store"), std::string::npos) << r1.err;
}

TEST_F(LauncherTest, AnElasticRanksUsageErrorEndsTheJobAcrossNodes) {
  // Status 2 (a flag not accepted) would repeat in every replacement: the launchers end the
  // job instead of replacing ranks that fail the same way while nobody ends it.
  const std::string script = "sleep 0.2; exit 2";
  std::string store;
  Child node0 =
      startNodeZero({"--elastic", "--bind", "none", "--", "sh", "-c", script}, "tok", &store);
  ASSERT_GT(node0.pid, 0);
  Child node1 = startNodeOne({"--elastic", "--bind", "none", "--", "sh", "-c", script}, "tok", store);
  Result r1 = collect(node1);
  Result r0 = collect(node0);
  EXPECT_NE(r0.exitCode(), 0) << r0.err;
  EXPECT_NE(r1.exitCode(), 0) << r1.err;
  EXPECT_NE(r0.err.find("a usage error that a replacement would repeat"), std::string::npos)
      << r0.err;
  EXPECT_EQ(r0.err.find("starting rank"), std::string::npos) << r0.err;
  EXPECT_EQ(r1.err.find("starting rank"), std::string::npos) << r1.err;
}

TEST_F(LauncherTest, RanksBuildACommunicatorFromTheEnvironment) {
  Result r = kolo({"run", "-n", "3", "--timeout", "60", "--", kProbe, "allreduce"});
  ASSERT_EQ(r.exitCode(), 0) << r.out << r.err;
  auto lines = splitLines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (const auto& text : lines)
    EXPECT_NE(text.find("size=3 backend=native sum=3"), std::string::npos) << text;
}

}  // namespace
}  // namespace kolo
