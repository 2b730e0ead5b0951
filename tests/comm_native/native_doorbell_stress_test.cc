// Stress of the shared-memory doorbell (the futex sleep/wake between ranks): more rank
// processes than CPUs, so waits run past their spin and sleep, through thousands of small
// all-reduces (every algorithm), send/recv ping-pongs, a non-blocking all-reduce in flight
// during a ping-pong (two waiters on one doorbell), and messages far larger than a tiny
// ring (the writer sleeps for space, the reader's doorbell wakes it). Every value is
// checked in closed form; every wait has a deadline, so a lost wake-up ends as a Timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "native_test_support.h"

namespace kolo::comm::testing {
namespace {

using namespace std::chrono_literals;

/// Deadline of every wait: far above any healthy wait, far below a test runner's limit.
constexpr auto kDeadline = 30s;

NativeOptions stressOptions() {
  NativeOptions options;
  options.timeout = kDeadline;
  options.crossMemoryAttach = false;  // everything through the rings and their doorbells
  return options;
}

/// Even ranks send first, odd ranks answer: `value` goes to rank ^ 1 and its value comes
/// back. Returns whether the partner's value (partnerValue) arrived.
bool pingPong(Communicator& comm, int64_t value, int64_t partnerValue, int tag, size_t count = 1) {
  const int partner = comm.rank() ^ 1;
  std::vector<int64_t> mine(count, value), theirs(count, -1);
  if (comm.rank() % 2 == 0) {
    comm.send(mine.data(), count, DType::I64, partner, tag);
    comm.recv(theirs.data(), count, DType::I64, partner, tag);
  } else {
    comm.recv(theirs.data(), count, DType::I64, partner, tag);
    comm.send(mine.data(), count, DType::I64, partner, tag);
  }
  for (int64_t v : theirs)
    if (v != partnerValue) return false;
  return true;
}

/// `rounds` rounds of: an all-reduce of 1..64 values (rank r contributes r + i + k at
/// element k, so the sum is n(n-1)/2 + n(i + k)) under an algorithm that cycles through
/// all of them, a ping-pong, and every fourth round a non-blocking all-reduce that is
/// still in flight while a ping-pong runs. Returns 0, or the number of the failed check.
int smallOpsBody(Communicator& comm, int rounds) {
  const int64_t n = comm.size();
  const int rank = comm.rank();
  const Algorithm algorithms[] = {Algorithm::Auto, Algorithm::Ring, Algorithm::HalvingDoubling,
                                  Algorithm::Tree, Algorithm::ReduceBroadcast};
  std::vector<int64_t> in(64), out(64), pending(64);
  for (int i = 0; i < rounds; ++i) {
    const size_t count = 1 + static_cast<size_t>(i * 7) % 64;
    for (size_t k = 0; k < count; ++k) in[k] = rank + i + static_cast<int64_t>(k);
    CollectiveOptions options;
    options.algorithm = algorithms[i % 5];
    comm.allreduce(in.data(), out.data(), count, DType::I64, ReduceOp::Sum, options);
    for (size_t k = 0; k < count; ++k) {
      if (out[k] != n * (n - 1) / 2 + n * (i + static_cast<int64_t>(k))) {
        std::fprintf(stderr, "rank %d round %d: all-reduce element %zu is %lld\n", rank, i, k,
                     static_cast<long long>(out[k]));
        return 2;
      }
    }
    if (!pingPong(comm, int64_t{i} * 1000 + rank, int64_t{i} * 1000 + (rank ^ 1), i % 7)) {
      std::fprintf(stderr, "rank %d round %d: ping-pong value wrong\n", rank, i);
      return 3;
    }
    if (i % 4 == 0) {
      for (size_t k = 0; k < 16; ++k) pending[k] = int64_t{rank} * (i + 1);
      auto work = comm.iallreduce(pending.data(), pending.data(), 16, DType::I64, ReduceOp::Sum);
      const bool ok = pingPong(comm, -i - 1 - rank, -i - 1 - (rank ^ 1), 100 + i % 3);
      work->wait();
      if (!ok) return 4;
      for (size_t k = 0; k < 16; ++k)
        if (pending[k] != n * (n - 1) / 2 * (i + 1)) return 5;
    }
  }
  comm.barrier();
  return 0;
}

/// Messages of 40,000 bytes or more through 4 KiB rings: every transfer fills the ring
/// many times over, so writers sleep for space and readers' doorbells wake them.
int largeOpsBody(Communicator& comm, int rounds) {
  const int64_t n = comm.size();
  const int rank = comm.rank();
  for (int i = 0; i < rounds; ++i) {
    const size_t count = 5000 + static_cast<size_t>(i % 3) * 1777;
    std::vector<int64_t> data(count);
    for (size_t k = 0; k < count; ++k) data[k] = rank * 3 + static_cast<int64_t>(k % 101) + i;
    comm.allreduce(data.data(), data.data(), count, DType::I64, ReduceOp::Sum);
    for (size_t k = 0; k < count; ++k) {
      if (data[k] != 3 * n * (n - 1) / 2 + n * (static_cast<int64_t>(k % 101) + i)) {
        std::fprintf(stderr, "rank %d round %d: element %zu is %lld\n", rank, i, k,
                     static_cast<long long>(data[k]));
        return 2;
      }
    }
    if (!pingPong(comm, int64_t{i} * 10 + rank, int64_t{i} * 10 + (rank ^ 1), 7, count)) return 3;
  }
  comm.barrier();
  return 0;
}

TEST(NativeDoorbellStress, ThousandsOfSmallOpsOnFourProcesses) {
  const int rounds = 5000;
  auto codes = runProcesses(
      4, [&](int, Communicator& comm) { return smallOpsBody(comm, rounds); }, stressOptions());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

TEST(NativeDoorbellStress, LargeMessagesThroughTinyRings) {
  NativeOptions options = stressOptions();
  options.ringBytes = 4096;
  auto codes = runProcesses(
      4, [](int, Communicator& comm) { return largeOpsBody(comm, 150); }, options);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

TEST(NativeDoorbellStress, TwoProcessPingPongs) {
  // Two ranks, one pair: the tightest handoff, each message waking the other side.
  auto codes = runProcesses(
      2,
      [](int, Communicator& comm) {
        for (int i = 0; i < 20000; ++i)
          if (!pingPong(comm, i * 2 + comm.rank(), i * 2 + (comm.rank() ^ 1), i % 5)) return 3;
        return 0;
      },
      stressOptions());
  for (int r = 0; r < 2; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

}  // namespace
}  // namespace kolo::comm::testing
