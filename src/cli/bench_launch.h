// How `kolo bench` gets its communicator: forking N local ranks that meet through a file
// store it hosts (--ranks), joining a job through a shared store directory (--store-dir),
// or as one rank of an enclosing `kolo run` / `mpirun` (the environment decides).
#pragma once

#include <string>

#include "cli/bench_runner.h"

namespace kolo::cli {

/// Where this process's communicator comes from.
struct BenchLaunch {
  /// "auto", "native" or "mpi".
  std::string backend = "auto";
  /// > 0: fork this many local ranks.
  int ranks = 0;
  /// With `ranks`: "core" binds forked rank i to one CPU (comm/affinity.h),
  /// "none" leaves them unbound.
  std::string bind = "core";
  /// Non-empty: join as rank `rank` of `worldSize` through a file store in this directory.
  std::string storeDir;
  int rank = -1;
  int worldSize = 0;
  /// Native backend settings passed through (empty/true = the backend's defaults).
  std::string listenAddress;
  std::string hostId;
  bool sharedMemory = true;
};

/// Runs the benchmark as `launch` says. Returns the process exit code: 0 when every result
/// was correct, 3 when a result was wrong, 1 when a rank failed. Throws kolo::Error for
/// settings that cannot work (e.g. --ranks with the MPI backend).
int launchBenchmark(const BenchConfig& config, const BenchLaunch& launch);

}  // namespace kolo::cli
