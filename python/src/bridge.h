// The plain C++ seam between kolo_torch's torch-facing code (compiled at torch's C++17)
// and kolo's communicator (C++20 headers): raw buffers, element types and reduce ops,
// a rendezvous store the torch side implements, and a blocking Group of collectives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kolo_torch {

/// Element types kolo reduces natively; everything else travels as Bytes.
enum class Type : uint8_t { F32, F64, F16, BF16, I32, I64, U8, Bytes };
/// Reductions kolo runs natively.
enum class Op : uint8_t { Sum, Prod, Min, Max, Avg };

/// The key-value store ranks meet through (torch's PrefixStore on the other side).
/// Every call may throw; waits throw when `timeout` passes.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// Waits up to `timeout` for key, then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool remove(const std::string& key) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
};

/// A handle of a started point-to-point transfer.
class Transfer {
 public:
  virtual ~Transfer() = default;
  /// Blocks until done (or the group's deadline); throws the transfer's error.
  virtual void wait() = 0;
  /// A finished receive's sender (the rank a receive from any rank took its message from).
  virtual int source() const = 0;
};

/// One kolo communicator. Calls block the calling thread until done; errors are thrown as
/// std::runtime_error (kolo::Error) whose message names the rank and the operation. One
/// thread at a time may call a Group's collectives. Counts are elements of `type`.
class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void allreduce(void* buf, size_t count, Type type, Op op) = 0;
  virtual void reduce(void* buf, size_t count, Type type, Op op, int root) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  /// recv holds size() blocks of `bytes`, rank r's at r * bytes.
  virtual void allgather(const void* send, void* recv, size_t bytes) = 0;
  /// Rank r contributes counts[r] bytes, placed contiguously in rank order.
  virtual void allgatherv(const void* send, void* recv, const std::vector<size_t>& counts) = 0;
  /// send holds size() blocks of `recvCount` elements; rank r receives the reduction of block r.
  virtual void reduceScatter(const void* send, void* recv, size_t recvCount, Type type, Op op) = 0;
  virtual void gather(const void* send, void* recv, size_t bytes, int root) = 0;
  virtual void scatter(const void* send, void* recv, size_t bytes, int root) = 0;
  /// Block j of this rank's send (`bytes` each) lands in block rank() of rank j's recv.
  virtual void alltoall(const void* send, void* recv, size_t bytes) = 0;
  /// Variable blocks: sendBytes[j] bytes at sendOffsets[j] go to rank j; recvBytes[j] bytes
  /// from rank j land at recvOffsets[j].
  virtual void alltoallv(const void* send, const std::vector<size_t>& sendBytes, const std::vector<size_t>& sendOffsets,
                         void* recv, const std::vector<size_t>& recvBytes, const std::vector<size_t>& recvOffsets) = 0;
  virtual void barrier() = 0;
  /// Point to point; `tag` >= 0 (negative tags are kolo_torch's own).
  virtual std::unique_ptr<Transfer> send(const void* buf, size_t bytes, int peer, int tag) = 0;
  /// `peer` -1: from whichever rank sends with `tag` first (Transfer::source() names it).
  virtual std::unique_ptr<Transfer> recv(void* buf, size_t bytes, int peer, int tag) = 0;
};

/// Rendezvous of `size` ranks through `store` (kolo's native backend: shared memory on a
/// host, TCP between hosts), every wait bounded by `timeout`. Keys live under "kolo/" in
/// the store, which torch prefixes per process group. Throws when a rank does not arrive.
std::shared_ptr<Group> createGroup(std::shared_ptr<RendezvousStore> store, int rank, int size,
                                   std::chrono::milliseconds timeout);

/// Address ("host:port") that rank `rank` of a `kolo run` job should host torch's TCPStore
/// at, agreed through the launcher's store at `storeAddress` with `token`: rank 0 draws a
/// free port on its address as the launcher's store sees it, the others read it.
std::string agreeTorchMaster(const std::string& storeAddress, const std::string& token, int rank,
                             const std::string& key, std::chrono::milliseconds timeout);

}  // namespace kolo_torch
