// End to end: examples/distributed_train started as 2 processes with torchrun's variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) prints the same global loss as 1 process with
// the same global batch, and reports its world size.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "support/fashion_mnist.h"
#include "support/reserved_port.h"

namespace {
namespace fs = std::filesystem;

const std::string kExample = std::string(KOLO_BINARY_DIR) + "/examples/distributed_train";
constexpr const char* kToken = "distributed-example";

std::string readText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts rank `rank` of `world` of the example for `steps` steps in `dir`, its output in
// dir/rank<rank>.log.
pid_t startRank(int rank, int world, int steps, const fs::path& dir, uint16_t port) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string log = (dir / ("rank" + std::to_string(rank) + ".log")).string();
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    ::chdir(dir.c_str());
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("KOLO_TOKEN", kToken, 1);
    ::setenv("KOLO_TIMEOUT", "60", 1);
    ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
    const std::string stepsArg = std::to_string(steps);
    ::execl(kExample.c_str(), kExample.c_str(), stepsArg.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  return pid;
}

// Runs `world` ranks of the example for `steps` steps in `dir`; returns rank 0's output.
std::string runRanks(int world, int steps, const fs::path& dir) {
  // Rank 0 hosts the store on MASTER_PORT. It starts alone, and the others once its store
  // answers; a reserved port another process took first means a fresh one (see
  // kReservedPortAttempts), any other failure of rank 0 fails the test.
  std::vector<pid_t> pids;
  int rank0Status = -1;  // set once rank 0 has been reaped
  for (int attempt = 1; pids.empty(); ++attempt) {
    const kolo::testing::ReservedPort port;
    const pid_t rank0 = startRank(0, world, steps, dir, port.port());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool serving = false;
    while (!serving && rank0Status == -1 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(rank0, &status, WNOHANG) == rank0) {
        rank0Status = status;
        break;
      }
      try {
        kolo::comm::connectTcpStore(port.address(), kToken, std::chrono::milliseconds(100));
        serving = true;
      } catch (const kolo::Error&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    const bool done = rank0Status != -1 && WIFEXITED(rank0Status) && WEXITSTATUS(rank0Status) == 0;
    if (serving || done) {
      pids.push_back(rank0);
      for (int rank = 1; rank < world; ++rank) pids.push_back(startRank(rank, world, steps, dir, port.port()));
      break;
    }
    if (rank0Status == -1) {
      ::kill(rank0, SIGKILL);
      ::waitpid(rank0, nullptr, 0);
      ADD_FAILURE() << "rank 0 of " << world << " did not host the store in 60 s";
      return readText(dir / "rank0.log");
    }
    const std::string log = readText(dir / "rank0.log");
    if (!kolo::testing::lostReservedPort(log) || attempt == kolo::testing::kReservedPortAttempts) {
      ADD_FAILURE() << "rank 0 of " << world << " failed to host the store on port " << port.port() << ": " << log;
      return log;
    }
    rank0Status = -1;
  }
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = rank0Status;
    if (r != 0 || status == -1) ::waitpid(pids[r], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " of " << world << " failed";
  }
  return readText(dir / "rank0.log");
}

std::string lineStarting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return line;
  return "";
}

TEST(DistributedExample, TwoRanksComputeWhatOneRankComputes) {
  if (!fs::exists(kExample)) GTEST_SKIP() << kExample << " was not built (KOLO_BUILD_EXAMPLES=OFF)";
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const fs::path dir = fs::temp_directory_path() / ("kolo_dist_example_" + std::to_string(::getpid()));
  fs::create_directories(dir / "one");
  fs::create_directories(dir / "two");
  const std::string one = runRanks(1, 100, dir / "one");
  const std::string two = runRanks(2, 100, dir / "two");
  const std::string lossOne = lineStarting(one, "step 100 loss");
  ASSERT_FALSE(lossOne.empty()) << one;
  const double a = std::stod(lossOne.substr(14));
  const double b = std::stod(lineStarting(two, "step 100 loss").substr(14));
  EXPECT_NEAR(a, b, 1e-3) << one << "\n" << two;
  EXPECT_NE(two.find("on 2 rank(s)"), std::string::npos) << two;
  EXPECT_TRUE(fs::exists(dir / "two" / "distributed_train.safetensors"));
  fs::remove_all(dir);
}

}  // namespace
