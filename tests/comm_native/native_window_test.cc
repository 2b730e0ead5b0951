// SharedWindow of the native backend: every rank reads every other rank's part, for ranks
// as threads and as forked processes; parts start zeroed; nothing is left in /dev/shm; a
// window larger than /dev/shm and a group spanning two hosts get no window on any rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "native_test_support.h"

namespace kolo::comm::testing {
namespace {

constexpr size_t kFloats = 100003;  // odd: parts are not page multiples

// Each rank writes value(rank, i) into its part; after a barrier every part holds its
// owner's values. Returns 0 when all checks pass, else a code naming the failure.
int exchangeThroughWindow(Communicator& comm) {
  auto window = comm.allocateSharedWindow(kFloats * sizeof(float));
  if (!window) return 2;
  if (window->bytes() != kFloats * sizeof(float)) return 3;
  if (reinterpret_cast<uintptr_t>(window->local()) % 64 != 0) return 4;
  auto* mine = static_cast<float*>(window->local());
  for (size_t i = 0; i < kFloats; ++i)
    if (mine[i] != 0.0f) return 5;
  auto value = [](int rank, size_t i) { return static_cast<float>(rank * 1000 + i % 997); };
  for (size_t i = 0; i < kFloats; ++i) mine[i] = value(comm.rank(), i);
  comm.barrier();
  for (int r = 0; r < comm.size(); ++r) {
    const auto* part = static_cast<const float*>(window->part(r));
    for (size_t i = 0; i < kFloats; ++i)
      if (part[i] != value(r, i)) return 10 + r;
  }
  comm.barrier();  // nobody unmaps a part another rank still reads
  return 0;
}

size_t windowObjectsInDevShm() {
  size_t count = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec))
    if (entry.path().filename().string().rfind("kolo-win-", 0) == 0) ++count;
  return count;
}

TEST(NativeWindow, ThreadRanksSeeEveryPart) {
  const size_t before = windowObjectsInDevShm();
  runThreads(3, [](Communicator& comm) { EXPECT_EQ(exchangeThroughWindow(comm), 0); });
  EXPECT_EQ(windowObjectsInDevShm(), before);
}

TEST(NativeWindow, ProcessRanksSeeEveryPart) {
  const size_t before = windowObjectsInDevShm();
  auto codes = runProcesses(4, [](int, Communicator& comm) { return exchangeThroughWindow(comm); });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(windowObjectsInDevShm(), before);
}

TEST(NativeWindow, MoreThanSharedMemoryHoldsGivesNoWindowOnEveryRank) {
  // 1 TiB per rank cannot be reserved in /dev/shm: every rank gets nullptr (no SIGBUS
  // later), nothing is left behind, and the group still works.
  const size_t before = windowObjectsInDevShm();
  runThreads(2, [](Communicator& comm) {
    EXPECT_EQ(comm.allocateSharedWindow(size_t{1} << 40), nullptr);
    EXPECT_EQ(exchangeThroughWindow(comm), 0);
  });
  EXPECT_EQ(windowObjectsInDevShm(), before);
}

TEST(NativeWindow, TwoHostsGetNoWindow) {
  auto codes = runProcessesWith(
      4,
      [](int, Communicator& comm) {
        const bool none = comm.allocateSharedWindow(4096) == nullptr;
        comm.barrier();  // the group still works afterwards
        return none ? 0 : 1;
      },
      [](int rank) {
        NativeOptions o;
        o.hostId = rank < 2 ? "host-a" : "host-b";
        return o;
      });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace kolo::comm::testing
