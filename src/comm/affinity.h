// CPU binding of local ranks, as mpirun binds its ranks: local rank i runs on the i-th CPU
// (modulo their count) of the set the launcher itself may use, so a narrower mask given
// to the launcher (taskset, cgroups) is respected. Used by `kolo run` and comm::spawn
// (`kolo bench --ranks`); the CpuBinding choice itself is public (kolo/comm/spawn.h).
#pragma once

#include <vector>

#include "kolo/comm/spawn.h"

namespace kolo::comm {

/// CPUs the calling thread may run on, ascending. Throws IoError when the kernel does not say.
std::vector<int> allowedCpus();

/// The CPU for local rank `localRank` under `binding`: allowed[localRank % allowed.size()],
/// or -1 for CpuBinding::None (or an empty set).
int cpuForLocalRank(CpuBinding binding, int localRank, const std::vector<int>& allowed);

/// Binds the calling thread to `cpu` (processes it starts afterwards inherit this).
/// Throws IoError naming the CPU when the kernel refuses.
void bindThisThread(int cpu);

/// Restricts the calling thread to one CPU for its lifetime and restores the previous
/// mask on destruction: children spawned meanwhile start bound. cpu < 0 changes nothing.
class ScopedThreadBinding {
 public:
  explicit ScopedThreadBinding(int cpu);
  ~ScopedThreadBinding();
  ScopedThreadBinding(const ScopedThreadBinding&) = delete;
  ScopedThreadBinding& operator=(const ScopedThreadBinding&) = delete;

 private:
  std::vector<int> previous_;
};

}  // namespace kolo::comm
