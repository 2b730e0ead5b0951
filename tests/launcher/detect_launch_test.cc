// detectLaunch for each launcher's variables (kolo run, torchrun, Open MPI, Slurm, none),
// their precedence and their validation; initFromEnvironment for a single process and
// for torchrun-style variables where rank 0 hosts the store.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "launcher/process_helpers.h"
#include "support/reserved_port.h"

namespace kolo::comm {
namespace {

using Env = std::map<std::string, std::string>;

TEST(DetectLaunchTest, NoVariablesMeansOneRank) {
  LaunchInfo info = detectLaunch(Env{{"HOME", "/root"}});
  EXPECT_EQ(info.launcher, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.localRank, 0);
  EXPECT_EQ(info.localSize, 1);
  EXPECT_TRUE(info.storeAddress.empty());
}

TEST(DetectLaunchTest, KoloRunVariables) {
  LaunchInfo info = detectLaunch(Env{{"KOLO_RANK", "5"},
                                     {"KOLO_WORLD_SIZE", "8"},
                                     {"KOLO_LOCAL_RANK", "1"},
                                     {"KOLO_LOCAL_SIZE", "4"},
                                     {"KOLO_STORE", "10.1.2.3:29500"},
                                     {"KOLO_TOKEN", "abc"},
                                     {"RANK", "0"},
                                     {"WORLD_SIZE", "2"}});
  EXPECT_EQ(info.launcher, "kolo");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.size, 8);
  EXPECT_EQ(info.localRank, 1);
  EXPECT_EQ(info.localSize, 4);
  EXPECT_EQ(info.storeAddress, "10.1.2.3:29500");
  EXPECT_EQ(info.token, "abc");
}

TEST(DetectLaunchTest, TorchrunVariables) {
  Env env{{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29500"},
          {"OMPI_COMM_WORLD_RANK", "0"},
          {"OMPI_COMM_WORLD_SIZE", "1"}};
  LaunchInfo info = detectLaunch(env);
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.size, 4);
  EXPECT_EQ(info.localRank, 1);
  EXPECT_EQ(info.localSize, 2);
  EXPECT_EQ(info.storeAddress, "node0:29500");
  EXPECT_EQ(info.token, "");
  // Under torchrun's agent, MASTER_PORT is taken by its own store: ours is the next port.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["MASTER_ADDR"] = "fd00::7";
  env["KOLO_TOKEN"] = "tok";
  info = detectLaunch(env);
  EXPECT_EQ(info.storeAddress, "[fd00::7]:29501");
  EXPECT_EQ(info.token, "tok");
}

TEST(DetectLaunchTest, OpenMpiVariablesTakePrecedenceOverSlurm) {
  LaunchInfo info = detectLaunch(Env{{"OMPI_COMM_WORLD_RANK", "2"},
                                     {"OMPI_COMM_WORLD_SIZE", "6"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                                     {"SLURM_PROCID", "0"},
                                     {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(info.launcher, "mpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.size, 6);
  EXPECT_EQ(info.localRank, 2);
  EXPECT_EQ(info.localSize, 3);
  EXPECT_TRUE(info.storeAddress.empty());
}

TEST(DetectLaunchTest, SlurmVariablesWithUnevenTasksPerNode) {
  Env env{{"SLURM_PROCID", "6"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "3"},
          {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
  LaunchInfo info = detectLaunch(env);
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.size, 7);
  EXPECT_EQ(info.localRank, 0);
  EXPECT_EQ(info.localSize, 1);
  env["SLURM_NODEID"] = "1";
  env["SLURM_LOCALID"] = "1";
  env["SLURM_PROCID"] = "3";
  env["MASTER_ADDR"] = "10.0.0.1";
  env["MASTER_PORT"] = "1234";
  info = detectLaunch(env);
  EXPECT_EQ(info.localRank, 1);
  EXPECT_EQ(info.localSize, 2);
  EXPECT_EQ(info.storeAddress, "10.0.0.1:1234");
}

TEST(DetectLaunchTest, BadValuesAreRejectedNamingTheVariable) {
  try {
    detectLaunch(Env{{"KOLO_RANK", "two"}, {"KOLO_WORLD_SIZE", "4"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("KOLO_RANK='two'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detectLaunch(Env{{"RANK", "4"}, {"WORLD_SIZE", "4"}}), InvalidArgument);
  EXPECT_THROW(detectLaunch(Env{{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), InvalidArgument);
  EXPECT_THROW(detectLaunch(Env{{"KOLO_RANK", "0"},
                                {"KOLO_WORLD_SIZE", "2"},
                                {"KOLO_LOCAL_RANK", "2"},
                                {"KOLO_LOCAL_SIZE", "2"}}),
               InvalidArgument);
  EXPECT_THROW(detectLaunch(Env{
                   {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "x"}}),
               InvalidArgument);
}

TEST(InitFromEnvironmentTest, SingleProcessGetsSizeOneCommunicator) {
  using namespace kolo::testing;
  Result r = runProgram({KOLO_LAUNCH_PROBE, "allreduce"}, cleanEnvironment());
  ASSERT_EQ(r.exitCode(), 0) << r.err;
  EXPECT_EQ(r.out, "allreduce rank=0 size=1 backend=native sum=0\n");
}

TEST(InitFromEnvironmentTest, TorchrunStyleRankZeroHostsTheStore) {
  using namespace kolo::testing;
  auto rankEnvironment = [](int rank, uint16_t port) {
    return cleanEnvironment({{"RANK", std::to_string(rank)},
                             {"WORLD_SIZE", "3"},
                             {"MASTER_ADDR", "127.0.0.1"},
                             {"MASTER_PORT", std::to_string(port)},
                             {"KOLO_TOKEN", "torch-style"},
                             {"KOLO_TIMEOUT", "60"}});
  };
  // Rank 0 hosts the store on MASTER_PORT. It starts alone, and the others once its store
  // answers; a reserved port another process took first means a fresh one (see
  // kReservedPortAttempts), any other failure of rank 0 fails the test.
  std::vector<Child> children;
  for (int attempt = 1; children.empty(); ++attempt) {
    const ReservedPort port;
    Child rank0 = spawnChild({KOLO_LAUNCH_PROBE, "allreduce"}, rankEnvironment(0, port.port()));
    const bool up = waitFor([&] {
      if (processGone(rank0.pid)) return true;
      try {
        connectTcpStore(port.address(), "torch-style", std::chrono::milliseconds(100));
        return true;
      } catch (const Error&) {
        return false;
      }
    });
    if (!up) ::kill(rank0.pid, SIGKILL);
    if (!up || processGone(rank0.pid)) {
      const Result r = collect(rank0);
      ASSERT_TRUE(up && lostReservedPort(r.err) && attempt < kReservedPortAttempts)
          << "rank 0 did not host the store on port " << port.port() << " (attempt " << attempt << "): " << r.err;
      continue;
    }
    children.push_back(rank0);
    for (int rank = 1; rank < 3; ++rank)
      children.push_back(spawnChild({KOLO_LAUNCH_PROBE, "allreduce"}, rankEnvironment(rank, port.port())));
  }
  for (int rank = 0; rank < 3; ++rank) {
    Result r = collect(children[static_cast<size_t>(rank)]);
    EXPECT_EQ(r.exitCode(), 0) << r.err;
    EXPECT_EQ(r.out, "allreduce rank=" + std::to_string(rank) + " size=3 backend=native sum=3\n");
  }
}

TEST(InitFromEnvironmentTest, BadBackendOrTimeoutIsRejected) {
  using namespace kolo::testing;
  Result r =
      runProgram({KOLO_LAUNCH_PROBE, "allreduce"}, cleanEnvironment({{"KOLO_BACKEND", "nccl"}}));
  EXPECT_EQ(r.exitCode(), 1);
  EXPECT_NE(r.err.find("KOLO_BACKEND='nccl' is not accepted"), std::string::npos) << r.err;
  r = runProgram({KOLO_LAUNCH_PROBE, "allreduce"}, cleanEnvironment({{"KOLO_TIMEOUT", "-3"}}));
  EXPECT_EQ(r.exitCode(), 1);
  EXPECT_NE(r.err.find("KOLO_TIMEOUT='-3'"), std::string::npos) << r.err;
}

// The local ranks' threads against this machine's cores (std::thread::hardware_concurrency).
TEST(HasSpareCoreTest, CountsTheLocalRanksThreadsAgainstTheCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(hasSpareCore(1), cores > 1);  // one process, one thread
  EXPECT_FALSE(hasSpareCore(cores));
  // Under kolo run with as many local ranks as cores: none to spare.
  ::setenv("KOLO_RANK", "0", 1);
  ::setenv("KOLO_WORLD_SIZE", std::to_string(cores).c_str(), 1);
  ::setenv("KOLO_LOCAL_SIZE", std::to_string(cores).c_str(), 1);
  EXPECT_FALSE(hasSpareCore(1));
  for (const char* name : {"KOLO_RANK", "KOLO_WORLD_SIZE", "KOLO_LOCAL_SIZE"}) ::unsetenv(name);
}

}  // namespace
}  // namespace kolo::comm
