// CPU binding of local ranks: the launcher's allowed set, round-robin choice, and binding
// of the calling thread (sched_setaffinity on thread id 0) so spawned children inherit it.
#include "comm/affinity.h"

#include <sched.h>

#include <cerrno>
#include <cstring>

#include "kolo/error.h"

namespace kolo::comm {
namespace {

void setMask(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::string list;
    for (int c : cpus) {
      if (!list.empty()) list += ',';
      list += std::to_string(c);
    }
    KOLO_THROW(IoError, "cannot bind to CPU(s) ", list, ": ", std::strerror(errno));
  }
}

}  // namespace

CpuBinding parseCpuBinding(const std::string& text) {
  if (text == "none") return CpuBinding::None;
  if (text == "core") return CpuBinding::Core;
  KOLO_THROW(InvalidArgument, "unknown CPU binding '", text, "' (expected none or core)");
}

const char* cpuBindingName(CpuBinding binding) {
  return binding == CpuBinding::Core ? "core" : "none";
}

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0)
    KOLO_THROW(IoError, "cannot read this thread's CPU affinity: ", std::strerror(errno));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

int cpuForLocalRank(CpuBinding binding, int localRank, const std::vector<int>& allowed) {
  if (binding == CpuBinding::None || allowed.empty() || localRank < 0) return -1;
  return allowed[static_cast<size_t>(localRank) % allowed.size()];
}

void bindThisThread(int cpu) { setMask({cpu}); }

ScopedThreadBinding::ScopedThreadBinding(int cpu) {
  if (cpu < 0) return;
  previous_ = allowedCpus();
  bindThisThread(cpu);
}

ScopedThreadBinding::~ScopedThreadBinding() {
  if (previous_.empty()) return;
  try {
    setMask(previous_);
  } catch (const Error&) {
    // The previous mask was valid moments ago; a failure leaves this thread bound, which
    // only narrows where the launcher's loop runs.
  }
}

}  // namespace kolo::comm
