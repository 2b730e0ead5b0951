// Starting under Slurm without anything set by hand: Slurm's compressed host lists expanded
// (and refused with the variable named), the store port derived from the job and step ids,
// detectLaunch's store address from a step's variables as srun sets them, and the MPI
// backend refused with kolo's own error under an srun step that MPI cannot start from.
#include <gtest/gtest.h>

#include "kolo/comm/init.h"
#include "kolo/comm/slurm.h"
#include "kolo/error.h"
#include "launcher/process_helpers.h"

namespace kolo::comm {
namespace {

using Env = std::map<std::string, std::string>;
using Hosts = std::vector<std::string>;

TEST(SlurmHostListTest, ExpandsNamesRangesAndPadding) {
  const std::string var = "SLURM_JOB_NODELIST";
  EXPECT_EQ(expandSlurmHostList(var, "node7"), Hosts({"node7"}));
  EXPECT_EQ(expandSlurmHostList(var, "node[01-04,07]"),
            Hosts({"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expandSlurmHostList(var, "a1,b[2-3]"), Hosts({"a1", "b2", "b3"}));
  EXPECT_EQ(expandSlurmHostList(var, "n[08-10]"), Hosts({"n08", "n09", "n10"}));
  EXPECT_EQ(expandSlurmHostList(var, "n[8-10]"), Hosts({"n8", "n9", "n10"}));
  EXPECT_EQ(expandSlurmHostList(var, "gpu-[3],cpu[001-002].ib,x"),
            Hosts({"gpu-3", "cpu001.ib", "cpu002.ib", "x"}));
  EXPECT_EQ(expandSlurmHostList(var, "rack[1-2]n[1,3]"),
            Hosts({"rack1n1", "rack1n3", "rack2n1", "rack2n3"}));
  EXPECT_EQ(expandSlurmHostList(var, "kolo-h1-17,kolo-h2-17"), Hosts({"kolo-h1-17", "kolo-h2-17"}));
  EXPECT_EQ(expandSlurmHostList(var, "n[0-99999]").size(), 100000u);
}

TEST(SlurmHostListTest, BadListsNameTheVariableAndValue) {
  for (const std::string bad :
       {"", ",", "a,", "node[1-", "node[1-2", "node]1", "node[[1]]", "node[3-1]", "node[]",
        "node[a-b]", "node[1-2-3]", "node[-1]", "node[1,,2]", "n[0-999999999]", "n[0-999]m[0-9999]"}) {
    try {
      expandSlurmHostList("SLURM_STEP_NODELIST", bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST='" + bad + "' is not a Slurm host list"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(SlurmHostListTest, StorePortDependsOnJobAndStep) {
  // 15000 + (jobId * 100 + stepId % 100) % 17000.
  EXPECT_EQ(slurmStorePort(0, 0), 15000);
  EXPECT_EQ(slurmStorePort(7, 0), 15700);
  EXPECT_EQ(slurmStorePort(7, 1), 15701);
  EXPECT_EQ(slurmStorePort(123456, 3), 15000 + (123456 * 100 + 3) % 17000);
  for (int64_t job : {1, 99, 4242, 987654321}) {
    for (int64_t step : {0, 1, 99}) {
      const int port = slurmStorePort(job, step);
      EXPECT_GE(port, 15000);
      EXPECT_LT(port, 32000);
    }
  }
  EXPECT_NE(slurmStorePort(41, 0), slurmStorePort(42, 0));
  EXPECT_NE(slurmStorePort(42, 0), slurmStorePort(42, 1));
}

// The variables srun sets for task 3 of `srun -N 2 --ntasks-per-node 2` in job 4242, step 1.
Env srunTask3() {
  return Env{{"SLURM_PROCID", "3"},          {"SLURM_NTASKS", "4"},
             {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "1"},
             {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
             {"SLURM_JOB_ID", "4242"},       {"SLURM_STEP_ID", "1"},
             {"SLURM_JOB_NODELIST", "node[06-07]"}, {"SLURM_STEP_NODELIST", "node[07-08]"}};
}

TEST(SlurmLaunchTest, StoreOnTheStepsFirstHostAtTheDerivedPort) {
  Env env = srunTask3();
  LaunchInfo info = detectLaunch(env);
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.size, 4);
  EXPECT_EQ(info.localRank, 1);
  EXPECT_EQ(info.localSize, 2);
  EXPECT_EQ(info.storeAddress, "node07:" + std::to_string(slurmStorePort(4242, 1)));
  // An sbatch script's own environment has the job's list only.
  env.erase("SLURM_STEP_NODELIST");
  EXPECT_EQ(detectLaunch(env).storeAddress, "node06:" + std::to_string(slurmStorePort(4242, 1)));
  env["KOLO_STORE_PORT"] = "29400";
  EXPECT_EQ(detectLaunch(env).storeAddress, "node06:29400");
  env.erase("KOLO_STORE_PORT");
  env["MASTER_PORT"] = "29500";
  EXPECT_EQ(detectLaunch(env).storeAddress, "node06:29500");
  env["MASTER_ADDR"] = "10.0.0.9";
  EXPECT_EQ(detectLaunch(env).storeAddress, "10.0.0.9:29500");
  env["KOLO_STORE_PORT"] = "29400";
  EXPECT_EQ(detectLaunch(env).storeAddress, "10.0.0.9:29400");
}

TEST(SlurmLaunchTest, AnSbatchScriptsOwnShellIsOneProcess) {
  // What `sbatch -N 2 --ntasks-per-node 2` gives its script: no step, so no other ranks.
  LaunchInfo info = detectLaunch(Env{{"SLURM_PROCID", "0"},
                                     {"SLURM_NTASKS", "4"},
                                     {"SLURM_JOB_ID", "2"},
                                     {"SLURM_TASKS_PER_NODE", "2(x2)"},
                                     {"SLURM_JOB_NODELIST", "node[1-2]"}});
  EXPECT_EQ(info.launcher, "single");
  EXPECT_EQ(info.size, 1);
}

TEST(SlurmLaunchTest, BadSlurmValuesAreNamed) {
  Env env = srunTask3();
  env["SLURM_STEP_NODELIST"] = "node[07-";
  try {
    detectLaunch(env);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST='node[07-'"), std::string::npos)
        << e.what();
  }
  env = srunTask3();
  env["SLURM_JOB_ID"] = "12x";
  EXPECT_THROW(detectLaunch(env), InvalidArgument);
  env = srunTask3();
  env["KOLO_STORE_PORT"] = "70000";
  try {
    detectLaunch(env);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("KOLO_STORE_PORT='70000'"), std::string::npos) << e.what();
  }
}

TEST(SlurmLaunchTest, MpiBackendUnderSrunWithoutPmiIsKolosError) {
  using namespace kolo::testing;
  Env env = srunTask3();
  env["KOLO_BACKEND"] = "mpi";
  const Result r = runProgram({KOLO_LAUNCH_PROBE, "allreduce"}, cleanEnvironment(env));
  EXPECT_EQ(r.exitCode(), 1);
  EXPECT_NE(r.err.find("rank 3 of 4: the MPI backend cannot start under this srun"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("OMPI"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kolo::comm
