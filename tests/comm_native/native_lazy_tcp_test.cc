// TCP connections opened when an operation first needs a peer: a ring connects a rank to
// its two neighbours only, an all-to-all to every peer; two ranks that need each other at
// the same moment end with one connection each way and the right data; a rank's first
// message to a peer that is busy elsewhere waits for nothing but that peer's next call;
// the world group's collectives rooted at rank 0 connect without the store once the
// rendezvous is over (a store hosted by rank 0 may be gone), and a pair outside that set
// without a store ends in a Timeout that says why.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/native/native_communicator.h"
#include "native_test_support.h"

namespace kolo::comm::testing {
namespace {

NativeOptions tcpOnly() {
  NativeOptions options;
  options.sharedMemory = false;
  options.listenAddress = "127.0.0.1";
  options.timeout = std::chrono::seconds(30);
  return options;
}

/// A store that fails every request once closed, as one whose host has left does.
class ClosableStore : public Store {
 public:
  explicit ClosableStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void close() { closed_ = true; }
  void set(const std::string& key, const Bytes& value) override { open().set(key, value); }
  Bytes get(const std::string& key, Millis timeout) override { return open().get(key, timeout); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    open().wait(keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return open().add(key, delta); }
  bool remove(const std::string& key) override { return open().remove(key); }
  bool check(const std::vector<std::string>& keys) override { return open().check(keys); }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Millis timeout) override {
    return open().multiGet(keys, timeout);
  }

 private:
  Store& open() {
    if (closed_) KOLO_THROW(IoError, "the test's store is closed");
    return *inner_;
  }
  std::shared_ptr<Store> inner_;
  std::atomic<bool> closed_{false};
};

/// Runs body on n thread ranks whose store closes once every rank has its communicator.
void runWithoutStoreAfterRendezvous(int n, const std::function<void(Communicator&)>& body,
                                    const std::function<NativeOptions(int)>& optionsFor) {
  auto store = std::make_shared<ClosableStore>(makeMemoryStore());
  std::barrier joined(n, [&]() noexcept { store->close(); });
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<Communicator> comm;
      try {
        comm = createNativeCommunicator(store, r, n, optionsFor(r));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
      joined.arrive_and_wait();
      try {
        if (comm) body(*comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

uint64_t tcpChannels(Communicator& comm) {
  return dynamic_cast<native::NativeCommunicator&>(comm).waitCounts().tcpChannels;
}

TEST(NativeLazyTcp, NothingIsConnectedBeforeTheFirstOperation) {
  runThreads(
      4, [](Communicator& comm) { EXPECT_EQ(tcpChannels(comm), 0u) << "rank " << comm.rank(); },
      tcpOnly());
}

TEST(NativeLazyTcp, ARingConnectsEachRankToItsTwoNeighboursOnly) {
  const int n = 8;
  // Counted before any rank starts the all-to-all, whose connections reach ranks still in the ring.
  std::barrier counted(n);
  runThreads(
      n,
      [n, &counted](Communicator& comm) {
        std::vector<float> values(1000, static_cast<float>(comm.rank()));
        CollectiveOptions ring;
        ring.algorithm = Algorithm::Ring;
        comm.allreduce(values.data(), values.data(), values.size(), DType::F32, ReduceOp::Sum,
                       ring);
        const float expected = static_cast<float>(n * (n - 1) / 2);
        EXPECT_EQ(values.front(), expected);
        EXPECT_EQ(values.back(), expected);
        EXPECT_EQ(tcpChannels(comm), 2u) << "rank " << comm.rank();
        counted.arrive_and_wait();
        // An all-to-all needs every peer.
        std::vector<int32_t> out(n), in(n, -1);
        std::iota(out.begin(), out.end(), comm.rank() * n);
        comm.alltoall(out.data(), in.data(), 1, DType::I32);
        for (int r = 0; r < n; ++r) EXPECT_EQ(in[static_cast<size_t>(r)], r * n + comm.rank());
        EXPECT_EQ(tcpChannels(comm), static_cast<uint64_t>(n - 1)) << "rank " << comm.rank();
      },
      tcpOnly());
}

// Every pair starts its connection from both ends at once (each rank sends to every other
// before it receives): one connection per pair survives, and every message arrives in
// order on it. Repeated with fresh communicators, so that the races land differently.
TEST(NativeLazyTcp, PairsThatNeedEachOtherAtOnceKeepOneConnection) {
  const int n = 5;
  for (int round = 0; round < 10; ++round) {
    runThreads(
        n,
        [n](Communicator& comm) {
          const int me = comm.rank();
          std::vector<std::unique_ptr<Work>> sends;
          std::vector<int32_t> sent(static_cast<size_t>(2 * n));
          for (int peer = 0; peer < n; ++peer) {
            if (peer == me) continue;
            for (int k = 0; k < 2; ++k) {
              int32_t& v = sent[static_cast<size_t>(2 * peer + k)];
              v = me * 100 + peer * 10 + k;
              sends.push_back(comm.isend(&v, 1, DType::I32, peer, /*tag=*/3));
            }
          }
          for (int peer = 0; peer < n; ++peer) {
            if (peer == me) continue;
            for (int k = 0; k < 2; ++k) {
              int32_t v = -1;
              comm.recv(&v, 1, DType::I32, peer, 3);
              EXPECT_EQ(v, peer * 100 + me * 10 + k) << "rank " << me << " from " << peer;
            }
          }
          for (auto& s : sends) s->wait();
          EXPECT_EQ(tcpChannels(comm), static_cast<uint64_t>(n - 1)) << "rank " << me;
          comm.barrier();
        },
        tcpOnly());
  }
}

// Rank 0's first message to rank 1 (a higher rank, which answers the greeting) and rank 2's
// to rank 0 (a lower one, which does not need to) are sent while the receiver is away from
// the communicator; both are delivered once it receives.
TEST(NativeLazyTcp, AFirstMessageReachesAPeerThatIsBusyElsewhere) {
  runThreads(
      3,
      [](Communicator& comm) {
        int32_t v = 0;
        if (comm.rank() == 0) {
          v = 41;
          auto sent = comm.isend(&v, 1, DType::I32, 1, 9);
          int32_t got = 0;
          comm.recv(&got, 1, DType::I32, 2, 9);
          EXPECT_EQ(got, 43);
          sent->wait();
        } else if (comm.rank() == 1) {
          std::this_thread::sleep_for(
              std::chrono::milliseconds(200));  // away from the communicator
          comm.recv(&v, 1, DType::I32, 0, 9);
          EXPECT_EQ(v, 41);
        } else {
          v = 43;
          comm.send(&v, 1, DType::I32, 0, 9);
        }
        comm.barrier();
      },
      tcpOnly());
}

void worldCollectivesRootedAtZero(Communicator& comm) {
  const int n = comm.size();
  for (Algorithm algo : {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree,
                         Algorithm::ReduceBroadcast, Algorithm::Hierarchical}) {
    for (size_t count : {size_t{1}, size_t{5000}}) {
      std::vector<float> values(count, static_cast<float>(comm.rank()));
      CollectiveOptions opts;
      opts.algorithm = algo;
      comm.allreduce(values.data(), values.data(), values.size(), DType::F32, ReduceOp::Sum, opts);
      if (values.back() != static_cast<float>(n * (n - 1) / 2))
        KOLO_THROW(Error, "allreduce (", algorithmName(algo), ") on rank ", comm.rank(), " got ",
                   values.back());
      int32_t word = comm.rank() == 0 ? 77 : 0;
      comm.broadcast(&word, 1, DType::I32, 0, opts);
      if (word != 77)
        KOLO_THROW(Error, "broadcast (", algorithmName(algo), ") on rank ", comm.rank(), " got ",
                   word);
    }
  }
  comm.barrier();
}

TEST(NativeLazyTcp, WorldCollectivesRootedAtZeroNeedNoStoreAfterRendezvous) {
  for (int n = 2; n <= 9; ++n)
    runWithoutStoreAfterRendezvous(n, worldCollectivesRootedAtZero, [](int) { return tcpOnly(); });
  // Three hosts of three ranks (hierarchical: shared memory within, leaders and rails over TCP).
  runWithoutStoreAfterRendezvous(9, worldCollectivesRootedAtZero, [](int rank) {
    NativeOptions o;
    o.hostId = "host-" + std::to_string(rank / 3);
    o.listenAddress = "127.0.0.1";
    o.timeout = std::chrono::seconds(30);
    return o;
  });
}

// Ranks 1 and 4 of nine are partners of no built-in algorithm rooted at rank 0: neither
// read where the other listens at rendezvous, and with the store gone neither can connect.
TEST(NativeLazyTcp, APairOutsideTheAlgorithmsWithoutAStoreTimesOutSayingWhy) {
  runWithoutStoreAfterRendezvous(
      9,
      [](Communicator& comm) {
        comm.setTimeout(std::chrono::milliseconds(500));
        int32_t word = 5;
        if (comm.rank() != 1 && comm.rank() != 4) return;
        try {
          if (comm.rank() == 1) {
            comm.send(&word, 1, DType::I32, 4, 1);
          } else {
            comm.recv(&word, 1, DType::I32, 1, 1);
          }
          ADD_FAILURE() << "rank " << comm.rank() << " reached its peer without a store";
        } catch (const Timeout& e) {
          EXPECT_NE(std::string(e.what()).find("cannot learn where it listens"), std::string::npos)
              << e.what();
        }
      },
      [](int) { return tcpOnly(); });
}

}  // namespace
}  // namespace kolo::comm::testing
