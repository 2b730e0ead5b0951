// Starting the ranks of `kolo bench`: forked local ranks over a file store in a private
// temporary directory, one rank joining through a given store directory, or one rank of
// an enclosing launcher. Forked ranks are bound to CPUs as `kolo run` binds them (--bind);
// a forked rank that fails stops its siblings (SIGTERM).
#include "cli/bench_launch.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "kolo/comm/init.h"
#include "kolo/comm/mpi.h"
#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "comm/affinity.h"

namespace kolo::cli {
namespace {

constexpr int kExitWrong = 3;
constexpr int kExitFailed = 1;

comm::NativeOptions nativeOptions(const BenchConfig& config, const BenchLaunch& launch) {
  comm::NativeOptions options;
  options.timeout = config.options.timeout;
  options.listenAddress = launch.listenAddress;
  options.hostId = launch.hostId;
  options.sharedMemory = launch.sharedMemory;
  options.storePrefix = "kolo-bench";
  return options;
}

// One rank's whole run; never throws (the message goes to stderr, the code says what happened).
template <class MakeComm>
int runRank(const BenchConfig& config, int rankForMessages, MakeComm makeComm) {
  try {
    auto comm = makeComm();
    comm->setTimeout(config.options.timeout);
    const bool ok = runBenchmark(*comm, config, comm->backendName(), stdout);
    if (!ok && comm->rank() == 0) std::fprintf(stderr, "kolo bench: some results were wrong\n");
    return ok ? 0 : kExitWrong;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo bench: rank %d: %s\n", rankForMessages, e.what());
    return kExitFailed;
  }
}

int forkRanks(const BenchConfig& config, const BenchLaunch& launch) {
  std::string pattern = (std::filesystem::temp_directory_path() / "kolo-bench-XXXXXX").string();
  std::vector<char> dirName(pattern.begin(), pattern.end());
  dirName.push_back('\0');
  if (mkdtemp(dirName.data()) == nullptr) {
    KOLO_THROW(IoError, "kolo bench: cannot create a store directory from ", pattern, ": ", std::strerror(errno));
  }
  const std::string storeDir(dirName.data());
  std::fflush(stdout);
  std::fflush(stderr);

  const comm::CpuBinding binding =
      launch.ranks > 1 ? comm::parseCpuBinding(launch.bind) : comm::CpuBinding::None;
  const std::vector<int> cpus =
      binding == comm::CpuBinding::None ? std::vector<int>{} : comm::allowedCpus();
  std::vector<pid_t> children;
  const pid_t launcher = getpid();
  for (int r = 0; r < launch.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      for (pid_t child : children) kill(child, SIGTERM);
      for (pid_t child : children) waitpid(child, nullptr, 0);
      std::filesystem::remove_all(storeDir);
      KOLO_THROW(IoError, "kolo bench: fork of rank ", r, " failed: ", std::strerror(err));
    }
    if (pid == 0) {
      // A rank dies with the benchmark process rather than waiting out its deadlines.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);
      const int code = runRank(config, r, [&] {
        if (const int cpu = comm::cpuForLocalRank(binding, r, cpus); cpu >= 0) comm::bindThisThread(cpu);
        return comm::createNativeCommunicator(comm::makeFileStore(storeDir), r, launch.ranks,
                                              nativeOptions(config, launch));
      });
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    children.push_back(pid);
  }

  // Wait for every rank; the first failure stops the others so that none waits for a
  // peer that is gone until its deadline.
  int result = 0;
  size_t running = children.size();
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto it = std::find(children.begin(), children.end(), pid);
    if (it == children.end()) continue;
    *it = -1;
    --running;
    int code = kExitFailed;
    if (WIFEXITED(status)) {
      code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status) && result == 0) {
      std::fprintf(stderr, "kolo bench: rank %ld died of signal %d\n", static_cast<long>(it - children.begin()),
                   WTERMSIG(status));
    }
    if (code != 0 && result == 0) {
      result = code;
      if (code != kExitWrong) {
        for (pid_t child : children) {
          if (child > 0) kill(child, SIGTERM);
        }
      }
    }
  }
  std::filesystem::remove_all(storeDir);
  return result;
}

}  // namespace

int launchBenchmark(const BenchConfig& config, const BenchLaunch& launch) {
  if (launch.ranks > 0) {
    if (launch.backend == "mpi") {
      KOLO_THROW(InvalidArgument, "kolo bench: --ranks starts native ranks; for MPI run `mpirun -np ",
                 launch.ranks, " kolo bench ... --backend mpi`");
    }
    return forkRanks(config, launch);
  }
  if (!launch.storeDir.empty()) {
    if (launch.rank < 0 || launch.worldSize <= 0 || launch.rank >= launch.worldSize) {
      KOLO_THROW(InvalidArgument, "kolo bench: --store-dir needs --rank R and --world-size N with 0 <= R < N (got ",
                 launch.rank, " and ", launch.worldSize, ")");
    }
    return runRank(config, launch.rank, [&] {
      return comm::createNativeCommunicator(comm::makeFileStore(launch.storeDir), launch.rank, launch.worldSize,
                                            nativeOptions(config, launch));
    });
  }
  if (launch.backend == "mpi") {
    return runRank(config, -1, [&] {
      comm::MpiOptions options = comm::mpiOptionsFromEnvironment();
      options.timeout = config.options.timeout;
      return comm::createMpiCommunicator(options);
    });
  }
  comm::InitOptions init;
  init.backend = launch.backend;
  init.timeout = config.options.timeout;
  return runRank(config, -1, [&] { return comm::initFromEnvironment(init); });
}

}  // namespace kolo::cli
