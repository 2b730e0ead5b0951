// Native communicator with ranks as threads of this process: every collective, dtype and
// op against closed-form values, point-to-point tags, non-blocking order, split groups,
// TCP-only wiring and signature mismatches.
#include <arpa/inet.h>
#include <sched.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "comm/closed_form.h"
#include "comm/native/native_communicator.h"
#include "native_test_support.h"

namespace kolo::comm::testing {
namespace {

using detail::kAllDTypes;
using detail::kAllReduceOps;

std::vector<uint8_t> filled(int rank, int ranks, size_t count, DType dtype, ReduceOp op) {
  std::vector<uint8_t> buf(count * dtypeSize(dtype) + 1);
  detail::fillClosedFormInput(buf.data(), dtype, count, op, rank, ranks);
  return buf;
}

void allreduceCase(Communicator& comm, size_t count, DType dtype, ReduceOp op, bool inPlace, Algorithm algo) {
  auto send = filled(comm.rank(), comm.size(), count, dtype, op);
  std::vector<uint8_t> out(send.size(), 0xee);
  CollectiveOptions opts;
  opts.algorithm = algo;
  void* dst = inPlace ? send.data() : out.data();
  comm.allreduce(send.data(), dst, count, dtype, op, opts);
  const std::string wrong = detail::closedFormMismatch(dst, dtype, count, op, comm.size());
  if (!wrong.empty())
    KOLO_THROW(Error, "allreduce count=", count, inPlace ? " in place: " : " out of place: ", wrong);
  if (!inPlace && count > 0 &&
      loadElement(dtype, send.data(), 0) != detail::closedFormInput(op, comm.rank(), comm.size(), 0))
    KOLO_THROW(Error, "out-of-place allreduce modified its input");
}

TEST(NativeThreads, AllreduceEveryDtypeAndOp) {
  for (int n : {1, 2, 3, 4}) {
    runThreads(n, [](Communicator& comm) {
      for (DType dtype : kAllDTypes)
        for (ReduceOp op : kAllReduceOps)
          for (bool inPlace : {false, true}) allreduceCase(comm, 7, dtype, op, inPlace, Algorithm::Auto);
    });
  }
}

TEST(NativeThreads, AllreduceCountsAndSizes) {
  for (int n : {1, 2, 3, 5, 8}) {
    runThreads(n, [](Communicator& comm) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}}) {
        allreduceCase(comm, count, DType::F32, ReduceOp::Sum, false, Algorithm::Auto);
        allreduceCase(comm, count, DType::I64, ReduceOp::Max, true, Algorithm::Auto);
      }
    });
  }
}

TEST(NativeThreads, LargeAllreduceEveryDtypeInPlaceAndNot) {
  runThreads(3, [](Communicator& comm) {
    for (DType dtype : kAllDTypes)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min})
        for (bool inPlace : {false, true}) allreduceCase(comm, 300007, dtype, op, inPlace, Algorithm::Auto);
  });
}

TEST(NativeThreads, EveryAlgorithmEveryCount) {
  for (Algorithm algo : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree, Algorithm::ReduceBroadcast,
                         Algorithm::Hierarchical}) {
    for (int n : {2, 3, 5}) {
      runThreads(n, [algo](Communicator& comm) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}}) {
          allreduceCase(comm, count, DType::F32, ReduceOp::Sum, false, algo);
          allreduceCase(comm, count, DType::F32, ReduceOp::Sum, true, algo);
        }
        for (DType dtype : kAllDTypes)
          for (ReduceOp op : kAllReduceOps) allreduceCase(comm, 7, dtype, op, dtype == DType::F64, algo);
      });
    }
  }
}

TEST(NativeThreads, HierarchicalAcrossTwoHostIds) {
  // Ranks 0..2 on host "a", 3..5 on "b": shared memory inside a host, TCP across.
  runThreadsWith(
      6,
      [](Communicator& comm) {
        auto* native = dynamic_cast<native::NativeCommunicator*>(&comm);
        ASSERT_NE(native, nullptr);
        ASSERT_EQ(native->hostCount(), 2);
        ASSERT_EQ(native->allreducePlan(Algorithm::Auto, 4 << 20), "hierarchical");
        for (size_t count : {size_t{1}, size_t{7}, size_t{1000003}}) {
          allreduceCase(comm, count, DType::F32, ReduceOp::Sum, false, Algorithm::Auto);
          allreduceCase(comm, count, DType::I32, ReduceOp::Max, true, Algorithm::Hierarchical);
          allreduceCase(comm, count, DType::F64, ReduceOp::Avg, false, Algorithm::Ring);
        }
      },
      [](int rank) {
        NativeOptions o;
        o.hostId = rank < 3 ? "a" : "b";
        return o;
      });
}

TEST(NativeThreads, HierarchicalRailAndLeaderLayouts) {
  // Equal hosts take the rail form (2+2, interleaved 2+2, 1+1+1; pipelined in segments
  // for two hosts); unequal ones (2+3) the leader form. Host names per rank for each layout:
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"}, {"a", "b", "a", "b"}, {"a", "b", "c"}, {"a", "a", "b", "b", "b"}};
  for (const auto& hosts : layouts) {
    runThreadsWith(
        static_cast<int>(hosts.size()),
        [](Communicator& comm) {
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}}) {
            allreduceCase(comm, count, DType::F32, ReduceOp::Sum, false, Algorithm::Hierarchical);
            allreduceCase(comm, count, DType::F32, ReduceOp::Sum, true, Algorithm::Hierarchical);
          }
          for (DType dtype : kAllDTypes)
            for (ReduceOp op : kAllReduceOps)
              for (bool inPlace : {false, true}) allreduceCase(comm, 7, dtype, op, inPlace, Algorithm::Hierarchical);
          allreduceCase(comm, 300007, DType::BF16, ReduceOp::Avg, false, Algorithm::Hierarchical);
          // Several segments of the two-host pipeline, a short last one included.
          allreduceCase(comm, 1000003, DType::F64, ReduceOp::Avg, false, Algorithm::Hierarchical);
          allreduceCase(comm, 1000003, DType::I32, ReduceOp::Max, true, Algorithm::Hierarchical);
        },
        [hosts](int rank) {
          NativeOptions o;
          o.hostId = hosts[static_cast<size_t>(rank)];
          return o;
        });
  }
}

TEST(NativeThreads, OverTcpOnly) {
  NativeOptions options;
  options.sharedMemory = false;
  for (int n : {2, 3}) {
    runThreads(
        n,
        [](Communicator& comm) {
          for (size_t count : {size_t{1}, size_t{7}, size_t{1000003}})
            allreduceCase(comm, count, DType::F32, ReduceOp::Sum, false, Algorithm::Auto);
          allreduceCase(comm, 7, DType::BF16, ReduceOp::Prod, true, Algorithm::Auto);
        },
        options);
  }
}

TEST(NativeThreads, OverIpv6Loopback) {
  NativeOptions options;
  options.sharedMemory = false;
  options.listenAddress = "::1";
  try {
    runThreads(
        3,
        [](Communicator& comm) {
          allreduceCase(comm, 1000003, DType::F32, ReduceOp::Sum, true, Algorithm::Ring);
          allreduceCase(comm, 7, DType::I64, ReduceOp::Min, false, Algorithm::Auto);
        },
        options);
  } catch (const IoError& e) {
    if (std::string(e.what()).find("cannot listen") != std::string::npos)
      GTEST_SKIP() << "no IPv6 loopback on this machine: " << e.what();
    throw;
  }
}

TEST(NativeThreads, PerCallTimeoutNamesTheAbsentRank) {
  auto store = makeMemoryStore();
  std::string message;
  std::atomic<bool> done{false};
  std::thread absent([&] {
    auto comm = createNativeCommunicator(store, 1, 2);
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  {
    auto comm = createNativeCommunicator(store, 0, 2);
    float v = 1.0f;
    CollectiveOptions opts;
    opts.timeout = std::chrono::milliseconds(300);
    try {
      comm->allreduce(&v, &v, 1, DType::F32, ReduceOp::Sum, opts);
    } catch (const Timeout& e) {
      message = e.what();
    }
    done = true;
    absent.join();
  }
  EXPECT_EQ(message, "allreduce #0 on rank 0: no data from rank 1 after 0.3 s");
}

// After a collective times out the ranks no longer agree on the sequence: the operations
// queued behind it fail at once with a PeerError naming the first failure, instead of each
// waiting out a deadline of its own (which made an elastic regroup wait twice the deadline).
TEST(NativeThreads, CollectivesAfterATimeoutFailAtOnceNamingIt) {
  auto store = makeMemoryStore();
  std::string first, second;
  std::atomic<bool> done{false};
  std::thread absent([&] {
    auto comm = createNativeCommunicator(store, 1, 2);
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  {
    auto comm = createNativeCommunicator(store, 0, 2);
    float a = 1.0f, b = 2.0f;
    CollectiveOptions opts;
    opts.timeout = std::chrono::milliseconds(300);
    auto workA = comm->iallreduce(&a, &a, 1, DType::F32, ReduceOp::Sum, opts);
    // A budget no test waits out: a second deadline would show as a Timeout, not PeerError.
    opts.timeout = std::chrono::minutes(10);
    auto workB = comm->iallreduce(&b, &b, 1, DType::F32, ReduceOp::Sum, opts);
    try {
      workA->wait();
    } catch (const Timeout& e) {
      first = e.what();
    }
    try {
      workB->wait();
    } catch (const PeerError& e) {
      second = e.what();
    }
    done = true;
    absent.join();
  }
  EXPECT_NE(first.find("allreduce #0 on rank 0"), std::string::npos) << first;
  // The earlier failure is named as the engine recorded it ("no data from rank 1 after 0.3 s"),
  // or as the waiting caller saw its own deadline pass ("not complete after 0.3 s"): either.
  const std::string prefix =
      "allreduce #1 on rank 0: not run, an earlier collective failed (allreduce #0 on rank 0: ";
  EXPECT_EQ(second.rfind(prefix, 0), 0u) << second;
  EXPECT_TRUE(second.find("after 0.3 s)") != std::string::npos) << second;
}

// A rank that gives up on a collective tells every peer at once, so that a rank waiting on
// it (here in another group's collective, which it never joins) fails now, with the cause,
// instead of at its own deadline: the elastic survivors' stall of a whole deadline.
TEST(NativeThreads, ARankThatGivesUpTellsThoseWaitingOnIt) {
  std::string waited;
  std::atomic<bool> done{false};
  runThreads(3, [&](Communicator& comm) {
    auto pair = comm.split(comm.rank() < 2 ? 0 : 1, comm.rank());
    float v = 1.0f;
    CollectiveOptions opts;
    if (comm.rank() == 0) {
      // Waits on rank 1 alone, with a deadline no test waits out.
      opts.timeout = std::chrono::minutes(1);
      try {
        pair->allreduce(&v, &v, 1, DType::F32, ReduceOp::Sum, opts);
      } catch (const Timeout& e) {
        waited = e.what();
      }
    } else if (comm.rank() == 1) {
      // An all-reduce of the whole group that ranks 0 and 2 never join: it times out.
      opts.timeout = std::chrono::milliseconds(300);
      EXPECT_THROW(comm.allreduce(&v, &v, 1, DType::F32, ReduceOp::Sum, opts), Timeout);
      done = true;
    }
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  const std::string expected = "allreduce #0 on rank 0: rank 1 gave up: allreduce #1 on rank 1: no data from rank ";
  EXPECT_EQ(waited.rfind(expected, 0), 0u) << waited;
  EXPECT_NE(waited.find("after 0.3 s"), std::string::npos) << waited;
}

// A wait whose yield hands the CPU to other work (here a thread computing on the same CPU)
// sleeps until its data comes instead of yielding again: yielding 200 times took a share
// of the CPU from the computation and saw the data a time slice late each time.
TEST(NativeThreads, AWaitSharingItsCpuWithComputationSleepsAfterOneYield) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed)) ++cpu;
  const auto pinHere = [cpu] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof(one), &one);
  };
  native::Engine::WaitCounts before{}, after{};
  runThreads(2, [&](Communicator& comm) {
    auto& engine = dynamic_cast<native::NativeCommunicator&>(comm);
    float v = 0.0f;
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.send(&v, 1, DType::F32, 0);
      return;
    }
    pinHere();
    std::atomic<bool> stop{false};
    std::thread computation([&] {
      pinHere();
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    before = engine.waitCounts();
    comm.recv(&v, 1, DType::F32, 1);
    after = engine.waitCounts();
    stop = true;
    computation.join();
  });
  EXPECT_EQ(after.slept - before.slept, 1u);
  // At most a few yields returned at once before one ran the computation (200 before).
  EXPECT_LE(after.yieldCalls - before.yieldCalls, 10u);
}

TEST(NativeThreads, ConnectionWithoutTokenIsRefusedAndJobCarriesOn) {
  NativeOptions options;
  options.sharedMemory = false;
  options.listenAddress = "127.0.0.1";
  auto store = makeMemoryStore();
  std::exception_ptr errors[2];
  std::thread rank0([&] {
    try {
      auto comm = createNativeCommunicator(store, 0, 2, options);
      int32_t v = 1;
      comm->allreduce(&v, &v, 1, DType::I32, ReduceOp::Sum);
      if (v != 2) KOLO_THROW(Error, "rank 0 got ", v);
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  // A stranger reads rank 0's port and connects first, with a wrong token.
  std::istringstream record(store->getString("kolo/native/rank/0", std::chrono::seconds(10)));
  std::string hostId, pid, port;
  std::getline(record, hostId);
  std::getline(record, pid);
  std::getline(record, port);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  char garbage[64];
  std::memset(garbage, 0x5a, sizeof(garbage));
  ASSERT_EQ(write(fd, garbage, sizeof(garbage)), static_cast<ssize_t>(sizeof(garbage)));
  close(fd);  // rank 0 finds it in its backlog before rank 1's and must refuse it
  std::thread rank1([&] {
    try {
      auto comm = createNativeCommunicator(store, 1, 2, options);
      int32_t v = 1;
      comm->allreduce(&v, &v, 1, DType::I32, ReduceOp::Sum);
      if (v != 2) KOLO_THROW(Error, "rank 1 got ", v);
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  rank0.join();
  rank1.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(NativeThreads, RootedAndGatherCollectives) {
  for (int n : {1, 2, 3, 4, 8}) {
    runThreads(n, [n](Communicator& comm) {
      const int me = comm.rank();
      const size_t count = 7;
      for (int root = 0; root < n; root += (n > 2 ? n - 1 : 1)) {
        // broadcast
        std::vector<int32_t> b(count, me == root ? 0 : -1);
        if (me == root)
          for (size_t i = 0; i < count; ++i) b[i] = static_cast<int32_t>(100 * root + i);
        comm.broadcast(b.data(), count, DType::I32, root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], static_cast<int32_t>(100 * root + i));
        // reduce
        std::vector<double> in(count), out(count, -1);
        detail::fillClosedFormInput(in.data(), DType::F64, count, ReduceOp::Sum, me, n);
        comm.reduce(in.data(), out.data(), count, DType::F64, ReduceOp::Sum, root);
        if (me == root) {
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(out[i], detail::closedFormResult(ReduceOp::Sum, n, i, DType::F64));
        }
        // gather
        std::vector<int64_t> mine(count), all(count * n, -1);
        for (size_t i = 0; i < count; ++i) mine[i] = me * 1000 + static_cast<int64_t>(i);
        comm.gather(mine.data(), all.data(), count, DType::I64, root);
        if (me == root) {
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], r * 1000 + static_cast<int64_t>(i));
        }
        // scatter
        std::vector<int64_t> part(count, -1);
        comm.scatter(all.data(), part.data(), count, DType::I64, root);
        if (me == root) {
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(part[i], me * 1000 + static_cast<int64_t>(i));
        }
      }
    });
  }
}

TEST(NativeThreads, ScatterDeliversEachRanksBlock) {
  runThreads(4, [](Communicator& comm) {
    const int n = comm.size();
    std::vector<float> all(3 * n), part(3, -1);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 3; ++i) all[r * 3 + i] = static_cast<float>(r * 10 + i);
    comm.scatter(all.data(), part.data(), 3, DType::F32, 2);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(part[i], static_cast<float>(comm.rank() * 10 + i));
  });
}

TEST(NativeThreads, AllgatherReduceScatterAlltoall) {
  for (int n : {1, 2, 3, 5, 8}) {
    runThreads(n, [n](Communicator& comm) {
      const int me = comm.rank();
      const size_t count = 7;
      // allgather out of place and in place
      std::vector<int32_t> mine(count), all(count * n, -1);
      for (size_t i = 0; i < count; ++i) mine[i] = me * 100 + static_cast<int32_t>(i);
      comm.allgather(mine.data(), all.data(), count, DType::I32);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], r * 100 + static_cast<int32_t>(i));
      std::vector<int32_t> inplace(count * n, -1);
      std::memcpy(inplace.data() + me * count, mine.data(), count * 4);
      comm.allgather(inplace.data() + me * count, inplace.data(), count, DType::I32);
      ASSERT_EQ(inplace, all);
      // allgatherv: rank r contributes r+1 elements
      std::vector<size_t> counts;
      size_t total = 0;
      for (int r = 0; r < n; ++r) {
        counts.push_back(static_cast<size_t>(r + 1));
        total += r + 1;
      }
      std::vector<uint8_t> vin(me + 1, static_cast<uint8_t>(me + 1)), vout(total, 0);
      comm.allgatherv(vin.data(), vout.data(), counts, DType::U8);
      size_t pos = 0;
      for (int r = 0; r < n; ++r)
        for (int i = 0; i <= r; ++i) ASSERT_EQ(vout[pos++], r + 1);
      // reduce-scatter: block b of rank r holds r + b; block me sums to n*me + n(n-1)/2
      std::vector<float> rsIn(count * n), rsOut(count, -1);
      for (int b = 0; b < n; ++b)
        for (size_t i = 0; i < count; ++i) rsIn[b * count + i] = static_cast<float>(me + b + i);
      comm.reduceScatter(rsIn.data(), rsOut.data(), count, DType::F32, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(rsOut[i], static_cast<float>(n * me + n * (n - 1) / 2 + n * static_cast<int>(i)));
      // alltoall: block j of rank i = i*100 + j lands in block i of rank j
      std::vector<int64_t> a2a(count * n), a2aOut(count * n, -1);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < count; ++i) a2a[j * count + i] = me * 100 + j * 10 + static_cast<int64_t>(i);
      comm.alltoall(a2a.data(), a2aOut.data(), count, DType::I64);
      for (int i = 0; i < n; ++i)
        for (size_t k = 0; k < count; ++k) ASSERT_EQ(a2aOut[i * count + k], i * 100 + me * 10 + static_cast<int64_t>(k));
      comm.alltoall(a2a.data(), a2a.data(), count, DType::I64);
      ASSERT_EQ(a2a, a2aOut);
      comm.barrier();
    });
  }
}

TEST(NativeThreads, PointToPointMatchesTags) {
  runThreads(3, [](Communicator& comm) {
    if (comm.rank() == 0) {
      int32_t a = 11, b = 22;
      std::vector<float> big(500000, 1.5f);
      comm.send(&a, 1, DType::I32, 1, /*tag=*/5);
      comm.send(&b, 1, DType::I32, 1, /*tag=*/6);
      comm.send(big.data(), big.size(), DType::F32, 2, 1);
    } else if (comm.rank() == 1) {
      int32_t a = 0, b = 0;
      comm.recv(&b, 1, DType::I32, 0, 6);  // arrives second: the first is held aside
      comm.recv(&a, 1, DType::I32, 0, 5);
      ASSERT_EQ(a, 11);
      ASSERT_EQ(b, 22);
    } else {
      std::vector<float> big(500000, 0.0f);
      auto w = comm.irecv(big.data(), big.size(), DType::F32, 0, 1);
      w->wait();
      ASSERT_EQ(big.front(), 1.5f);
      ASSERT_EQ(big.back(), 1.5f);
    }
    comm.barrier();
  });
}

// Receives from kAnySource: messages that arrived before the receive (held aside) and after
// it (matched on arrival, a large one in several pieces), each sender's in the order sent,
// a receive for a named sender served first, and the sender named by Work::source() in group
// ranks (a sub-group's too).
TEST(NativeThreads, ReceiveFromAnySourceNamesEachSender) {
  runThreads(4, [](Communicator& comm) {
    const int me = comm.rank();
    constexpr int kTag = 7;
    constexpr size_t kBig = 300000;
    // Round 1: every other rank sends two small messages, all arriving before rank 0 asks.
    if (me != 0) {
      for (int k = 0; k < 2; ++k) {
        const int32_t v = me * 10 + k;
        comm.send(&v, 1, DType::I32, 0, kTag);
      }
    }
    comm.barrier();
    if (me == 0) {
      int32_t named = -1;
      comm.recv(&named, 1, DType::I32, 2, kTag);  // the named receive takes rank 2's first
      EXPECT_EQ(named, 20);
      std::map<int, std::vector<int32_t>> got;
      for (int i = 0; i < 5; ++i) {
        int32_t v = -1;
        auto w = comm.irecv(&v, 1, DType::I32, kAnySource, kTag);
        w->wait();
        got[w->source()].push_back(v);
      }
      EXPECT_EQ(got[1], (std::vector<int32_t>{10, 11}));
      EXPECT_EQ(got[2], (std::vector<int32_t>{21}));
      EXPECT_EQ(got[3], (std::vector<int32_t>{30, 31}));
    }
    comm.barrier();
    // Round 2: rank 0 asks first; rank 3 sends a large message after the others.
    std::vector<std::unique_ptr<Work>> works;
    std::vector<std::vector<float>> bufs(3, std::vector<float>(kBig, -1.0f));
    if (me == 0)
      for (auto& b : bufs) works.push_back(comm.irecv(b.data(), kBig, DType::F32, kAnySource, kTag));
    comm.barrier();
    if (me != 0) {
      std::vector<float> mine(kBig, static_cast<float>(me));
      comm.send(mine.data(), kBig, DType::F32, 0, kTag);
    }
    if (me == 0) {
      std::set<int> sources;
      for (size_t i = 0; i < works.size(); ++i) {
        works[i]->wait();
        sources.insert(works[i]->source());
        EXPECT_EQ(bufs[i].front(), static_cast<float>(works[i]->source()));
        EXPECT_EQ(bufs[i].back(), static_cast<float>(works[i]->source()));
      }
      EXPECT_EQ(sources, (std::set<int>{1, 2, 3}));
    }
    // In a sub-group of the odd ranks, rank 3 is group rank 1.
    auto odd = comm.split(me % 2, me);
    if (me == 1) {
      int32_t v = -1;
      auto w = odd->irecv(&v, 1, DType::I32, kAnySource, kTag);
      w->wait();
      EXPECT_EQ(w->source(), 1);
      EXPECT_EQ(v, 33);
    } else if (me == 3) {
      const int32_t v = 33;
      odd->send(&v, 1, DType::I32, 0, kTag);
    }
    comm.barrier();
  });
}

TEST(NativeThreads, ReceiveFromAnySourceTimesOutNamingNoRank) {
  runThreads(2, [](Communicator& comm) {
    if (comm.rank() == 0) {
      int32_t v = 0;
      auto w = comm.irecv(&v, 1, DType::I32, kAnySource, 3);
      try {
        w->wait(std::chrono::milliseconds(200));
        ADD_FAILURE() << "a receive nobody sent to completed";
      } catch (const Timeout& e) {
        EXPECT_EQ(std::string(e.what()), "recv (tag 3) on rank 0: no data from any rank after 0.2 s");
      }
    }
    comm.barrier();
  });
}

TEST(NativeThreads, NonBlockingCompleteInStartOrder) {
  runThreads(3, [](Communicator& comm) {
    const int n = comm.size();
    std::vector<std::vector<float>> bufs(6, std::vector<float>(1000, static_cast<float>(comm.rank() + 1)));
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 5; ++k)
      works.push_back(comm.iallreduce(bufs[k].data(), bufs[k].data(), 1000, DType::F32, ReduceOp::Sum));
    std::vector<int32_t> b(4, comm.rank() == 1 ? 9 : 0);
    works.push_back(comm.ibroadcast(b.data(), 4, DType::I32, 1));
    // A blocking collective started now runs after the queued ones.
    comm.allreduce(bufs[5].data(), bufs[5].data(), 1000, DType::F32, ReduceOp::Max);
    for (auto& w : works) w->wait();
    for (int k = 0; k < 5; ++k) ASSERT_EQ(bufs[k][999], static_cast<float>(n * (n + 1) / 2));
    ASSERT_EQ(bufs[5][0], static_cast<float>(n));
    ASSERT_EQ(b[3], 9);
  });
}

TEST(NativeThreads, SplitIntoSubgroups) {
  runThreads(6, [](Communicator& comm) {
    const int me = comm.rank();
    // Even and odd ranks, ordered by descending old rank.
    auto sub = comm.split(me % 2, -me);
    ASSERT_NE(sub, nullptr);
    ASSERT_EQ(sub->size(), 3);
    const int expectedRank = (me % 2 == 0) ? (4 - me) / 2 : (5 - me) / 2;
    ASSERT_EQ(sub->rank(), expectedRank);
    int64_t v = me;
    sub->allreduce(&v, &v, 1, DType::I64, ReduceOp::Sum);
    ASSERT_EQ(v, me % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    // Interleave parent and child traffic, then a nested split and a rank left out.
    float w = 1.0f;
    comm.allreduce(&w, &w, 1, DType::F32, ReduceOp::Sum);
    ASSERT_EQ(w, 6.0f);
    auto pair = sub->split(sub->rank() < 2 ? 0 : -1, 0);
    if (sub->rank() < 2) {
      ASSERT_NE(pair, nullptr);
      int32_t x = sub->rank() + 1;
      pair->allreduce(&x, &x, 1, DType::I32, ReduceOp::Prod);
      ASSERT_EQ(x, 2);
    } else {
      ASSERT_EQ(pair, nullptr);
    }
    sub->barrier();
    comm.barrier();
  });
}

/// Runs `call` on n ranks as threads, each with a communicator whose deadline is
/// `timeout`; returns what each rank's Mismatch said ("" when none came, "wrong exception:
/// ..." for any other error).
std::vector<std::string> mismatchMessages(int n, std::chrono::seconds timeout,
                                          const std::function<void(int, Communicator&)>& call) {
  std::vector<std::string> messages(static_cast<size_t>(n));
  auto store = makeMemoryStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = createNativeCommunicator(store, r, n);
      comm->setTimeout(timeout);
      try {
        call(r, *comm);
      } catch (const Mismatch& e) {
        messages[r] = e.what();
      } catch (const std::exception& e) {
        messages[r] = std::string("wrong exception: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return messages;
}

TEST(NativeThreads, MismatchedCountNamesBothRanks) {
  const auto messages = mismatchMessages(2, std::chrono::seconds(5), [](int r, Communicator& comm) {
    std::vector<float> buf(1000, 1.0f);
    comm.allreduce(buf.data(), buf.data(), r == 0 ? 1000 : 999, DType::F32, ReduceOp::Sum);
  });
  EXPECT_NE(messages[0].find("allreduce #0 on rank 0 (f32 sum count=1000) vs rank 1 (f32 sum count=999)"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[1].find("on rank 1 (f32 sum count=999) vs rank 0 (f32 sum count=1000)"), std::string::npos)
      << messages[1];
}

TEST(NativeThreads, PlanPicksSingleCopyForLargeSingleHostAllreduce) {
  runThreads(2, [](Communicator& comm) {
    auto& native = dynamic_cast<native::NativeCommunicator&>(comm);
    EXPECT_TRUE(native.crossMemoryAttach());
    EXPECT_EQ(native.allreducePlan(Algorithm::Auto, 64 << 20), "cma");
    // One message per pair while every rank has a CPU; log2(p) exchanges otherwise.
    EXPECT_EQ(native.allreducePlan(Algorithm::Auto, 4096), native.oversubscribed() ? "halving-doubling" : "direct");
    EXPECT_EQ(native.allreducePlan(Algorithm::Ring, 64 << 20), "ring");
  });
}

TEST(NativeThreads, MismatchedAlgorithmIsReported) {
  const auto messages = mismatchMessages(2, std::chrono::seconds(3), [](int r, Communicator& comm) {
    std::vector<float> v(100, 1.0f);
    CollectiveOptions opts;
    opts.algorithm = r == 0 ? Algorithm::Ring : Algorithm::Tree;
    comm.allreduce(v.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum, opts);
  });
  EXPECT_NE(messages[0].find("(f32 sum count=100 ring) vs rank 1 (f32 sum count=100 tree)"), std::string::npos)
      << messages[0];
}

TEST(NativeThreads, MismatchedOpIsReported) {
  std::string plan;
  const auto messages = mismatchMessages(3, std::chrono::seconds(3), [&plan](int r, Communicator& comm) {
    if (r == 0) plan = dynamic_cast<native::NativeCommunicator&>(comm).allreducePlan(Algorithm::Auto, 4);
    int32_t v = 1;
    comm.allreduce(&v, &v, 1, DType::I32, r == 2 ? ReduceOp::Max : ReduceOp::Sum);
  });
  EXPECT_NE(messages[2].find("(i32 max count=1) vs rank"), std::string::npos) << messages[2];
  // Direct: every rank hears from rank 2. Halving-doubling (3 ranks on fewer CPUs): rank 0
  // folds into rank 1, which exchanges with rank 2 and names it.
  const int witness = plan == "direct" ? 0 : 1;
  EXPECT_NE(messages[witness].find("vs rank 2 (i32 max count=1)"), std::string::npos)
      << "plan " << plan << ": " << messages[witness];
}

}  // namespace
}  // namespace kolo::comm::testing
