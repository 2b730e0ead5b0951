// CPU binding of local ranks, as mpirun binds its ranks: local rank i runs on the i-th CPU
// (modulo their count) of the set the launcher itself may use, so a narrower mask given
// to the launcher (taskset, cgroups) is respected. Used by `kolo run` and `kolo bench --ranks`.
#pragma once

#include <string>
#include <vector>

namespace kolo::parallel {

/// How local ranks are placed on CPUs.
enum class CpuBinding {
  /// Ranks inherit the launcher's affinity; the scheduler places them.
  None,
  /// Each rank is bound to one CPU of the launcher's allowed set (round robin).
  Core,
};

/// Parses "none" or "core"; throws InvalidArgument naming the text otherwise.
CpuBinding parseCpuBinding(const std::string& text);
/// "none" or "core".
const char* cpuBindingName(CpuBinding binding);

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

}  // namespace kolo::parallel
