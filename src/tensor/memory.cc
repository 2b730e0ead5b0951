// Process-wide tensor memory accounting and the --memory-limit budget.
#include "kolo/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <cstdio>
#include <string>

#include "kolo/error.h"

namespace kolo {
namespace {

std::atomic<int64_t> live{0};
std::atomic<int64_t> peak{0};
std::atomic<int64_t> limit{0};

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

int64_t liveTensorBytes() { return live.load(std::memory_order_relaxed); }
int64_t peakTensorBytes() { return peak.load(std::memory_order_relaxed); }
void resetPeakTensorBytes() { peak.store(live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
void keepFreedMemory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void setTensorMemoryLimit(int64_t bytes) {
  KOLO_REQUIRE(bytes >= 0, "tensor memory limit must be at least 0, got ", bytes);
  limit.store(bytes, std::memory_order_relaxed);
}
int64_t tensorMemoryLimit() { return limit.load(std::memory_order_relaxed); }

namespace detail {

void chargeTensorBytes(size_t bytes, const Shape& shape, DType dtype) {
  const int64_t n = static_cast<int64_t>(bytes);
  const int64_t now = live.fetch_add(n, std::memory_order_relaxed) + n;
  const int64_t budget = limit.load(std::memory_order_relaxed);
  if (budget > 0 && now > budget) {
    live.fetch_sub(n, std::memory_order_relaxed);
    KOLO_THROW(MemoryLimitError, "tensor memory limit of ", mib(budget), " exceeded: a ", dtypeName(dtype), " ",
               shapeString(shape), " tensor of ", mib(n), " with ", mib(now - n),
               " already allocated (setTensorMemoryLimit)");
  }
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

void releaseTensorBytes(size_t bytes) { live.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed); }

}  // namespace detail
}  // namespace kolo
