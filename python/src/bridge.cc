// kolo_torch's kolo side: the bridge Group over kolo's native Communicator, the kolo Store
// over the torch side's RendezvousStore, and the `kolo run` handshake that gives torch's
// env:// rendezvous its MASTER_ADDR and MASTER_PORT.
#include "bridge.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "kolo/comm/communicator.h"
#include "kolo/comm/native.h"
#include "kolo/comm/store.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo_torch {
namespace {

using kolo::DType;
namespace comm = kolo::comm;

// kolo_torch's own point-to-point tags: user tags are >= 0.
constexpr int kAlltoallvTag = -7;

DType toDType(Type type) {
  switch (type) {
    case Type::F32: return DType::F32;
    case Type::F64: return DType::F64;
    case Type::F16: return DType::F16;
    case Type::BF16: return DType::BF16;
    case Type::I32: return DType::I32;
    case Type::I64: return DType::I64;
    case Type::U8:
    case Type::Bytes: return DType::U8;
  }
  throw std::invalid_argument("kolo_torch: unknown element type");
}

comm::ReduceOp toReduceOp(Op op) {
  switch (op) {
    case Op::Sum: return comm::ReduceOp::Sum;
    case Op::Prod: return comm::ReduceOp::Prod;
    case Op::Min: return comm::ReduceOp::Min;
    case Op::Max: return comm::ReduceOp::Max;
    case Op::Avg: return comm::ReduceOp::Avg;
  }
  throw std::invalid_argument("kolo_torch: unknown reduce op");
}

/// kolo's Store over the torch side's store.
class BridgedStore : public comm::Store {
 public:
  explicit BridgedStore(std::shared_ptr<RendezvousStore> store) : store_(std::move(store)) {}
  void set(const std::string& key, const comm::Bytes& value) override { store_->set(key, value); }
  comm::Bytes get(const std::string& key, comm::Millis timeout) override {
    wait({key}, timeout);
    return store_->get(key, timeout);
  }
  /// Polls check() so that a deadline ends in kolo's Timeout naming the missing keys (the
  /// rendezvous turns them into the ranks that did not arrive), whatever torch's store throws.
  void wait(const std::vector<std::string>& keys, comm::Millis timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(200);
    while (!store_->check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string missing;
        for (const auto& key : keys)
          if (!store_->check({key})) missing += (missing.empty() ? "" : ", ") + key;
        KOLO_THROW(kolo::Timeout, "torch store: key(s) ", missing, " not set after ",
                   static_cast<double>(timeout.count()) / 1000.0, " s");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  bool remove(const std::string& key) override { return store_->remove(key); }
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }

 private:
  std::shared_ptr<RendezvousStore> store_;
};

class KoloTransfer : public Transfer {
 public:
  explicit KoloTransfer(std::unique_ptr<comm::Work> work) : work_(std::move(work)) {}
  void wait() override { work_->wait(); }
  int source() const override { return work_->source(); }

 private:
  std::unique_ptr<comm::Work> work_;
};

class KoloGroup : public Group {
 public:
  explicit KoloGroup(std::shared_ptr<comm::Communicator> comm) : comm_(std::move(comm)) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  void allreduce(void* buf, size_t count, Type type, Op op) override {
    comm_->allreduce(buf, buf, count, toDType(type), toReduceOp(op));
  }
  void reduce(void* buf, size_t count, Type type, Op op, int root) override {
    comm_->reduce(buf, buf, count, toDType(type), toReduceOp(op), root);
  }
  void broadcast(void* buf, size_t bytes, int root) override { comm_->broadcast(buf, bytes, DType::U8, root); }
  void allgather(const void* send, void* recv, size_t bytes) override {
    comm_->allgather(send, recv, bytes, DType::U8);
  }
  void allgatherv(const void* send, void* recv, const std::vector<size_t>& counts) override {
    comm_->allgatherv(send, recv, counts, DType::U8);
  }
  void reduceScatter(const void* send, void* recv, size_t recvCount, Type type, Op op) override {
    comm_->reduceScatter(send, recv, recvCount, toDType(type), toReduceOp(op));
  }
  void gather(const void* send, void* recv, size_t bytes, int root) override {
    comm_->gather(send, recv, bytes, DType::U8, root);
  }
  void scatter(const void* send, void* recv, size_t bytes, int root) override {
    comm_->scatter(send, recv, bytes, DType::U8, root);
  }
  void alltoall(const void* send, void* recv, size_t bytes) override {
    comm_->alltoall(send, recv, bytes, DType::U8);
  }
  void alltoallv(const void* send, const std::vector<size_t>& sendBytes, const std::vector<size_t>& sendOffsets,
                 void* recv, const std::vector<size_t>& recvBytes, const std::vector<size_t>& recvOffsets) override {
    // Composed from point to point on a tag of kolo_torch's own: every pair exchanges its
    // blocks (empty ones too, so a size mismatch shows as an error rather than a hang).
    const int me = rank();
    const auto* in = static_cast<const uint8_t*>(send);
    auto* out = static_cast<uint8_t*>(recv);
    std::memcpy(out + recvOffsets[me], in + sendOffsets[me], std::min(sendBytes[me], recvBytes[me]));
    std::vector<std::unique_ptr<comm::Work>> pending;
    for (int step = 1; step < size(); ++step) {
      const int to = (me + step) % size();
      const int from = (me - step + size()) % size();
      pending.push_back(comm_->irecv(out + recvOffsets[from], recvBytes[from], DType::U8, from, kAlltoallvTag));
      pending.push_back(comm_->isend(in + sendOffsets[to], sendBytes[to], DType::U8, to, kAlltoallvTag));
    }
    for (auto& work : pending) work->wait();
  }
  void barrier() override { comm_->barrier(); }
  std::unique_ptr<Transfer> send(const void* buf, size_t bytes, int peer, int tag) override {
    return std::make_unique<KoloTransfer>(comm_->isend(buf, bytes, DType::U8, peer, tag));
  }
  std::unique_ptr<Transfer> recv(void* buf, size_t bytes, int peer, int tag) override {
    return std::make_unique<KoloTransfer>(
        comm_->irecv(buf, bytes, DType::U8, peer < 0 ? comm::kAnySource : peer, tag));
  }

 private:
  std::shared_ptr<comm::Communicator> comm_;
};

/// A port that is free on `host` now (bound, read back, released).
uint16_t freePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "0", &hints, &found) != 0 || found == nullptr)
    throw std::runtime_error("kolo_torch: cannot resolve this rank's address '" + host + "'");
  const int fd = socket(found->ai_family, SOCK_STREAM, 0);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  const bool ok = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0;
  freeaddrinfo(found);
  if (fd >= 0) close(fd);
  if (!ok) throw std::runtime_error("kolo_torch: cannot bind a port on '" + host + "': " + std::strerror(errno));
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

}  // namespace

std::shared_ptr<Group> createGroup(std::shared_ptr<RendezvousStore> store, int rank, int size,
                                   std::chrono::milliseconds timeout) {
  comm::NativeOptions options;
  options.timeout = timeout;
  options.storePrefix = "kolo";
  auto kstore = std::make_shared<BridgedStore>(std::move(store));
  return std::make_shared<KoloGroup>(comm::createNativeCommunicator(kstore, rank, size, options));
}

std::string agreeTorchMaster(const std::string& storeAddress, const std::string& token, int rank,
                             const std::string& key, std::chrono::milliseconds timeout) {
  const comm::HostPort hp = comm::parseHostPort(storeAddress);
  comm::TcpStoreClientOptions options;
  options.host = hp.host;
  options.port = hp.port;
  options.token = token;
  options.connectTimeout = timeout;
  options.requestTimeout = timeout;
  comm::TcpStoreClient client(options);
  if (rank == 0) {
    const std::string host = client.localAddress();
    const comm::HostPort master{host, freePort(host)};
    client.setString(key, master.toString());
    return master.toString();
  }
  return client.getString(key, timeout);
}

}  // namespace kolo_torch
