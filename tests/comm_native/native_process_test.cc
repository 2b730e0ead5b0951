// Native communicator with ranks as forked processes over the file store: shared
// memory, cross-memory attach and TCP between processes, sizes up to 8, and the failure
// cases: a SIGKILLed rank (PeerError within twice the deadline; at four ranks every survivor
// names it, told by the others' Abort messages), a SIGSTOPped rank (Timeout naming it),
// each started by the parent only when the ranks say they are ready, and ranks that call
// different sizes (every rank fails at once with a Mismatch naming both).
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/closed_form.h"
#include "comm/native/native_communicator.h"
#include "native_test_support.h"
#include "support/readiness_pipe.h"

namespace kolo::comm::testing {
namespace {

using Ms = std::chrono::milliseconds;

/// Body for one rank: all-reduce checks; returns 0 when every value is right.
int allreduceChecks(Communicator& comm, const std::vector<size_t>& counts) {
  const int n = comm.size();
  for (size_t count : counts) {
    for (DType dtype : {DType::F32, DType::I32, DType::BF16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        std::vector<uint8_t> buf(count * dtypeSize(dtype) + 1);
        detail::fillClosedFormInput(buf.data(), dtype, count, op, comm.rank(), n);
        std::vector<uint8_t> out(buf.size());
        comm.allreduce(buf.data(), out.data(), count, dtype, op);
        comm.allreduce(buf.data(), buf.data(), count, dtype, op);
        for (const auto* result : {&out, &buf}) {
          const std::string wrong = detail::closedFormMismatch(result->data(), dtype, count, op, n);
          if (!wrong.empty()) {
            std::fprintf(stderr, "rank %d: allreduce%s: %s\n", comm.rank(), result == &buf ? " in place" : "",
                         wrong.c_str());
            return 2;
          }
        }
      }
    }
  }
  // A few other collectives across processes.
  std::vector<int32_t> all(static_cast<size_t>(n) * 3);
  int32_t mine[3] = {comm.rank(), comm.rank() * 2, comm.rank() * 3};
  comm.allgather(mine, all.data(), 3, DType::I32);
  for (int r = 0; r < n; ++r)
    if (all[r * 3 + 2] != r * 3) return 3;
  int64_t b = comm.rank() == n - 1 ? 77 : 0;
  comm.broadcast(&b, 1, DType::I64, n - 1);
  if (b != 77) return 4;
  auto sub = comm.split(comm.rank() % 2, comm.rank());
  float v = 1.0f;
  sub->allreduce(&v, &v, 1, DType::F32, ReduceOp::Sum);
  if (v != static_cast<float>(sub->size())) return 5;
  comm.barrier();
  return 0;
}

TEST(NativeProcesses, AllreduceAcrossSizes) {
  for (int n : {2, 3, 4}) {
    auto codes = runProcesses(n, [](int, Communicator& comm) {
      return allreduceChecks(comm, {0, 1, 7, 1000003});
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << n;
  }
}

TEST(NativeProcesses, EightRanksSmallCounts) {
  auto codes = runProcesses(8, [](int, Communicator& comm) { return allreduceChecks(comm, {1, 7, 1000}); });
  for (int r = 0; r < 8; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NativeProcesses, OverTcpBetweenProcesses) {
  NativeOptions options;
  options.sharedMemory = false;
  auto codes = runProcesses(3, [](int, Communicator& comm) { return allreduceChecks(comm, {1, 7, 1000003}); },
                            options);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NativeProcesses, TwoHostsByHostIdUseTcpBetweenAndShmWithin) {
  // Ranks 0,1 claim host "a" and 2,3 host "b": shared memory inside, TCP across.
  auto codes = runProcessesWith(
      4, [](int, Communicator& comm) { return allreduceChecks(comm, {7, 1000003}); },
      [](int rank) {
        NativeOptions o;
        o.hostId = rank < 2 ? "host-a" : "host-b";
        return o;
      });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

/// Expects `what` from an all-reduce of `count` floats that a peer will never finish; exit
/// code 0 when the right exception, mentioning each of `mustMention`, arrived within
/// `limit`, 10 + something otherwise.
template <class Expected>
int expectFailure(Communicator& comm, Ms deadline, Ms limit, const std::vector<std::string>& mustMention,
                  size_t count = 1 << 16) {
  comm.setTimeout(deadline);
  std::vector<float> buf(count, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm.allreduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
  } catch (const Expected& e) {
    const auto took = std::chrono::steady_clock::now() - t0;
    std::fprintf(stderr, "rank %d got the expected error after %.2f s: %s\n", comm.rank(),
                 std::chrono::duration<double>(took).count(), e.what());
    if (took > limit) return 11;
    for (const std::string& words : mustMention)
      if (std::string(e.what()).find(words) == std::string::npos) return 12;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: unexpected error: %s\n", comm.rank(), e.what());
    return 13;
  }
  return 14;
}

/// `mustMention`: over shared memory every survivor watches rank 2's pid; over TCP a
/// survivor may first see another survivor leave (it closed its sockets on the error).
/// Rank 2 is killed once every rank has its communicator (rendezvous done) and the
/// survivors are about to start the all-reduce.
void killedRankCase(const NativeOptions& options, const std::string& mustMention) {
  const Ms deadline(2000);
  kolo::testing::ReadinessPipe ready;
  auto codes = runProcesses(
      3,
      [&](int rank, Communicator& comm) {
        ready.signal();
        if (rank == 2) {
          pause();  // killed by the parent while the others wait for it
          return 0;
        }
        return expectFailure<PeerError>(comm, deadline, 2 * deadline, {mustMention});
      },
      options,
      [&](const std::vector<pid_t>& pids) {
        ready.awaitSignals(3);
        kill(pids[2], SIGKILL);
      });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

TEST(NativeProcesses, KilledRankGivesPeerErrorOverSharedMemory) { killedRankCase({}, "rank 2"); }

TEST(NativeProcesses, KilledRankGivesPeerErrorOverTcp) {
  NativeOptions options;
  options.sharedMemory = false;
  killedRankCase(options, "is gone");
}

/// Four ranks, rank 2 killed: a survivor whose all-reduce waits on a live rank (that waits on
/// rank 2) learns of the loss from that rank's Abort message, long before its deadline, and
/// names rank 2 like the survivors that saw it go.
void killedRankOfFourCase(const NativeOptions& options) {
  const Ms deadline(30000);
  kolo::testing::ReadinessPipe ready;
  auto codes = runProcesses(
      4,
      [&](int rank, Communicator& comm) {
        ready.signal();
        if (rank == 2) {
          pause();
          return 0;
        }
        return expectFailure<PeerError>(comm, deadline, deadline / 2, {"rank 2"});
      },
      options,
      [&](const std::vector<pid_t>& pids) {
        ready.awaitSignals(4);
        kill(pids[2], SIGKILL);
      });
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NativeProcesses, EverySurvivorOfFourNamesTheKilledRankOverSharedMemory) {
  killedRankOfFourCase({});
}

TEST(NativeProcesses, EverySurvivorOfFourNamesTheKilledRankOverTcp) {
  NativeOptions options;
  options.sharedMemory = false;
  killedRankOfFourCase(options);
}

void stoppedRankCase(const NativeOptions& options, const std::string& mustMention) {
  const Ms deadline(1000);
  kolo::testing::ReadinessPipe ready;
  auto codes = runProcesses(
      3,
      [&](int rank, Communicator& comm) {
        if (rank == 1) {
          ready.signal();
          raise(SIGSTOP);
          return 0;
        }
        const int code = expectFailure<Timeout>(comm, deadline, 2 * deadline, {mustMention});
        ready.signal();  // this survivor is done with the stopped rank
        return code;
      },
      options,
      [&](const std::vector<pid_t>& pids) {
        // The stopped rank is ended once both survivors have had their Timeout.
        ready.awaitSignals(3);
        kill(pids[1], SIGKILL);
      });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[2], 0);
}

TEST(NativeProcesses, StoppedRankGivesTimeoutNamingIt) { stoppedRankCase({}, "rank 1 after 1.0 s"); }

// Over TCP nothing is connected before the all-reduce: the stopped rank's kernel takes the
// connections (rank 0's waits for an answer to its greeting), and it never reads them. A
// survivor whose ring step waits on the other survivor, itself waiting on the stopped rank,
// may run out of time naming that survivor before its Abort arrives (their deadlines end
// together), so only the Timeout and its deadline are required here.
TEST(NativeProcesses, StoppedRankGivesTimeoutOverTcp) {
  NativeOptions options;
  options.sharedMemory = false;
  stoppedRankCase(options, "after 1.0 s");
}

// Rank 3 of four all-reduces one element fewer. The ranks that receive from it see the
// disagreement; the others wait on ranks that gave up. Each rank that sees it tells every
// peer (Abort), so every rank fails with a Mismatch naming both sizes long before its
// deadline, as when a rank is killed, instead of the bystanders waiting the deadline out.
TEST(NativeProcesses, MismatchedSizeEndsEveryRankWithAMismatchNamingBothSizes) {
  const Ms deadline(30000);
  const size_t count = 1 << 16;
  auto codes = runProcesses(4, [&](int rank, Communicator& comm) {
    return expectFailure<Mismatch>(comm, deadline, deadline / 2, {"count=65536", "count=65535", " vs rank "},
                                   rank == 3 ? count - 1 : count);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// The first 200 small all-reduces after a communicator's first collective, counted per call:
// none sets up a ring (the first collective made the ring each rank writes and mapped the
// one it reads), so none takes that slow path. How many waits slept is printed, not checked:
// on a loaded machine any wait may find its peer descheduled.
TEST(NativeProcesses, TheFirstTwoHundredSmallAllreducesSetUpNothing) {
  auto codes = runProcesses(2, [](int rank, Communicator& comm) {
    auto& native = dynamic_cast<native::NativeCommunicator&>(comm);
    comm.barrier();
    const uint64_t setUp = native.waitCounts().ringSetups;
    std::vector<float> buf(1024, 0.0f);  // 4 KiB
    int slowCalls = 0;
    uint64_t slept = 0;
    for (int call = 0; call < 200; ++call) {
      const auto before = native.waitCounts();
      comm.allreduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
      const auto after = native.waitCounts();
      if (after.ringSetups != before.ringSetups) ++slowCalls;
      slept += after.slept - before.slept;
    }
    std::fprintf(stderr, "rank %d: %llu rings after the barrier, %d of 200 calls set one up, %llu waits slept\n",
                 rank, static_cast<unsigned long long>(setUp), slowCalls, static_cast<unsigned long long>(slept));
    return setUp == 2 && slowCalls == 0 ? 0 : 1;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// Figures for the report, not a test: 2 ranks, median time per all-reduce (max over ranks),
// each rank bound to its own core as mpirun binds Open MPI's ranks. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*Perf*'.
TEST(NativeProcesses, DISABLED_PerfTwoRankAllreduce) {
  runProcesses(2, [](int rank, Communicator& comm) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(rank % static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)), &one);
    sched_setaffinity(0, sizeof(one), &one);
    for (size_t bytes : {size_t{4096}, size_t{65536}, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20}) {
      const size_t count = bytes / 4;
      std::vector<float> buf(count, 0.0f);  // zeros stay zeros: values never grow
      const int iters = bytes <= 65536 ? 2000 : bytes <= (1 << 20) ? 200 : 20;
      std::vector<double> times;
      for (int it = 0; it < iters + 3; ++it) {
        comm.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        comm.allreduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
        const auto t1 = std::chrono::steady_clock::now();
        if (it >= 3) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      comm.allreduce(times.data(), times.data(), times.size(), DType::F64, ReduceOp::Max);
      std::sort(times.begin(), times.end());
      const double med = times[times.size() / 2];
      if (rank == 0)
        std::printf("allreduce np=2 bytes=%zu t_median_us=%.2f p10=%.2f p90=%.2f busbw_GBps=%.3f\n", bytes, med,
                    times[times.size() / 10], times[times.size() * 9 / 10], bytes / med / 1e3);
    }
    std::fflush(stdout);
    return 0;
  });
}

}  // namespace
}  // namespace kolo::comm::testing
