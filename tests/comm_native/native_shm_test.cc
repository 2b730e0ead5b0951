// The native backend's shared memory: rings exist only between ranks that exchange
// messages, and a job that the host's shared memory cannot hold is refused at rendezvous,
// on every local rank, with the bytes needed and where they were missing.
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "native_test_support.h"

namespace kolo::comm::testing {
namespace {

/// Mappings in this process of unnamed shared files (/dev/shm/#inode or memfd) of `bytes`.
int sharedMappingsOf(size_t bytes) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/#") == std::string::npos && line.find("memfd:kolo") == std::string::npos) continue;
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream(line) >> std::hex >> lo >> dash >> hi;
    if (hi - lo == bytes) ++count;
  }
  return count;
}

TEST(NativeSharedMemory, RingsOnlyBetweenRanksThatExchangeMessages) {
  // 8 thread ranks, 64 KiB rings: a ring all-reduce pairs r -> r+1 and the dissemination
  // barrier r -> r+1, r+2, r+4, so at most 3 rings per rank are written (each mapped by its
  // writer and its reader), against 7 per rank if every pair had one.
  constexpr int kRanks = 8;
  constexpr size_t kRing = 64 * 1024;
  NativeOptions options;
  options.ringBytes = kRing;
  options.crossMemoryAttach = false;
  int mapped = -1;
  runThreads(kRanks, [&](Communicator& comm) {
    std::vector<float> data(4096, 1.0f);
    CollectiveOptions ring;
    ring.algorithm = Algorithm::Ring;
    comm.allreduce(data.data(), data.data(), data.size(), DType::F32, ReduceOp::Sum, ring);
    comm.barrier();
    if (comm.rank() == 0) mapped = sharedMappingsOf(kRing);
    comm.barrier();
    EXPECT_EQ(data[17], float{kRanks});
  }, options);
  EXPECT_GE(mapped, 2 * kRanks);
  EXPECT_LE(mapped, 2 * kRanks * 3);
  std::printf("%d ring mappings for %d ranks (every pair would be %d)\n", mapped, kRanks, 2 * kRanks * (kRanks - 1));
}

TEST(NativeSharedMemory, JobTooLargeForTheHostIsRefusedAtRendezvousOnEveryRank) {
  // 1 TiB rings cannot fit anywhere: every local rank fails rendezvous, naming the need.
  NativeOptions options;
  options.ringBytes = size_t{1} << 40;
  std::mutex mutex;
  std::vector<std::string> messages;
  auto store = makeMemoryStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        createNativeCommunicator(store, r, 3, options);
      } catch (const IoError& e) {
        std::lock_guard<std::mutex> lock(mutex);
        messages.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(messages.size(), 3u) << "every rank gets IoError";
  for (const auto& m : messages) {
    EXPECT_NE(m.find("3 local ranks need"), std::string::npos) << m;
    EXPECT_NE(m.find("MiB available"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace kolo::comm::testing
