// Finding this process's place in a job: from `kolo run`'s variables (KOLO_RANK,
// KOLO_WORLD_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE, KOLO_STORE, KOLO_TOKEN), torchrun's
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI's (OMPI_COMM_WORLD_*)
// or Slurm's (SLURM_PROCID, SLURM_NTASKS, ...), else a single rank.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/comm/store.h"

namespace kolo::comm {

/// Where this process stands in the job, as the environment says.
struct LaunchInfo {
  int rank = 0;
  int size = 1;
  int localRank = 0;
  int localSize = 1;
  /// "kolo", "torchrun", "mpi", "slurm" or "single".
  std::string launcher = "single";
  /// host:port of the TCP store ("" when none); under srun the step's first host and a port
  /// derived from the job and step ids unless MASTER_ADDR, MASTER_PORT or KOLO_STORE_PORT say.
  std::string storeAddress;
  std::string token;
};

/// Reads the launch information from `env` (normally the process environment).
LaunchInfo detectLaunch(const std::map<std::string, std::string>& env);
LaunchInfo detectLaunch();

/// Whether this machine has a core beyond those that the compute threads of this launch's
/// local ranks occupy (detectLaunch().localSize ranks of `threadsPerRank` threads each).
/// Overlapping communication with backward needs one for the communication's progress, and
/// a thread prefetching batches without one only takes turns with the compute thread: turn
/// them on where this holds (ReducerOptions::overlap, train::FitOptions::prefetch).
bool hasSpareCore(int threadsPerRank);

struct InitOptions {
  /// "auto" (MPI under mpirun when built with MPI, else native, srun included), "native" or
  /// "mpi" (refused under an srun step without a PMI server, where MPI cannot start).
  std::string backend = "auto";
  /// Default deadline for collectives; KOLO_TIMEOUT (seconds) overrides.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

/// Builds the communicator for this process from its environment (Horovod's hvd.init()).
/// A single process without launcher variables gets a communicator of size 1.
std::shared_ptr<Communicator> initFromEnvironment(const InitOptions& options = {});

}  // namespace kolo::comm
