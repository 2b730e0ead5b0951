// Communicator: rank, size, point-to-point and collective operations over raw buffers.
// Backends: native (shared memory within a host, TCP across hosts) and MPI. Every
// collective carries a sequence number and a signature checked across ranks, and every
// wait has a deadline, so a mismatch or a vanished peer ends in an exception, not a hang.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/dtype.h"

namespace kolo::comm {

enum class ReduceOp : uint8_t { Sum, Prod, Min, Max, Avg };

/// All-reduce (and related) algorithms. Auto picks by message size and topology; the
/// environment variable KOLO_ALGO (ring, halving-doubling, tree, reduce-broadcast,
/// hierarchical; read by kolo::settings::algo()) overrides Auto for every backend: the
/// native backend runs kolo's own algorithm of that name; the MPI backend hands ring,
/// halving-doubling, tree and reduce-broadcast to Open MPI as its algorithm choice and
/// rejects hierarchical (MpiOptions::algorithm, kolo/comm/mpi.h).
enum class Algorithm : uint8_t { Auto, Ring, HalvingDoubling, Tree, ReduceBroadcast, Hierarchical };

const char* reduceOpName(ReduceOp op);
ReduceOp parseReduceOp(const std::string& name);
const char* algorithmName(Algorithm algo);
Algorithm parseAlgorithm(const std::string& name);

/// Seconds the calling thread has spent blocked in communication so far: in blocking
/// operations and in waits on non-blocking ones, over every communicator of the process (what
/// the thread could not overlap with its work, waiting for slower ranks included).
/// train::fit reads it to split a step's time where no reducer measures it.
double blockedSeconds();

/// Per-call options. A zero timeout means the communicator's default deadline.
struct CollectiveOptions {
  Algorithm algorithm = Algorithm::Auto;
  std::chrono::milliseconds timeout{0};
};

/// Handle of a non-blocking operation.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until complete; rethrows the operation's error. A zero timeout means the
  /// communicator's default deadline; Timeout is thrown when it passes.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
  /// True when complete (successfully or not); never blocks.
  virtual bool test() = 0;
  /// A receive's sender once it is complete: the rank a receive from kAnySource took its
  /// message from (or a named receive's peer); -1 for other operations or before completion.
  virtual int source() const { return -1; }
};

/// `peer` of Communicator::recv / irecv: the message of whichever rank sends one with the
/// tag first (MPI_ANY_SOURCE); irecv's Work::source() names it.
inline constexpr int kAnySource = -1;

/// Memory that the ranks of a communicator on one host address directly, as MPI-3's
/// MPI_Win_allocate_shared: each rank owns `bytes()` of it and can load and store the
/// parts of the other ranks. The window orders nothing by itself: ranks separate writing a
/// part and reading it with a collective (barrier()). Freed when the last reference goes.
class SharedWindow {
 public:
  virtual ~SharedWindow() = default;
  /// Bytes of every rank's part (all ranks asked for the same size).
  virtual size_t bytes() const = 0;
  /// This rank's part (64-byte aligned, zero-filled when allocated).
  virtual void* local() = 0;
  /// Rank `rank`'s part as mapped in this process.
  virtual void* part(int rank) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "native" or "mpi".
  virtual std::string backendName() const = 0;
  /// Default deadline for every wait.
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void setTimeout(std::chrono::milliseconds timeout) = 0;

  /// Collective over all ranks: ranks with the same color form a new communicator, ordered
  /// by (key, old rank). A negative color returns nullptr for that rank.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // ---- point to point (blocking, and non-blocking returning a Work) ----
  // Messages between two ranks with one tag arrive in the order sent. A receive takes exactly
  // `count` elements (another length is a Mismatch); its `peer` may be kAnySource.
  virtual void send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual void recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> isend(const void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> irecv(void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;

  // ---- collectives; sendbuf == recvbuf means in place ----
  virtual void allreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                         const CollectiveOptions& opts = {}) = 0;
  /// Non-blocking all-reduce; buffers must stay valid until the Work completes. Operations
  /// complete in the order they were started, on every rank.
  virtual std::unique_ptr<Work> iallreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                                           ReduceOp op, const CollectiveOptions& opts = {}) = 0;
  virtual void reduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
                      const CollectiveOptions& opts = {}) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveOptions& opts = {}) = 0;
  virtual std::unique_ptr<Work> ibroadcast(void* buf, size_t count, DType dtype, int root,
                                           const CollectiveOptions& opts = {}) = 0;
  /// recvbuf holds size() * count elements, rank r's block at r * count.
  virtual void allgather(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                         const CollectiveOptions& opts = {}) = 0;
  /// Rank r contributes recvcounts[r] elements, placed contiguously in rank order.
  virtual void allgatherv(const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvcounts, DType dtype,
                          const CollectiveOptions& opts = {}) = 0;
  /// sendbuf holds size() * recvcount elements; rank r receives the reduction of block r.
  virtual void reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype, ReduceOp op,
                             const CollectiveOptions& opts = {}) = 0;
  /// root's recvbuf holds size() * count elements.
  virtual void gather(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
                      const CollectiveOptions& opts = {}) = 0;
  /// root's sendbuf holds size() * count elements; each rank receives count.
  virtual void scatter(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
                       const CollectiveOptions& opts = {}) = 0;
  /// Block j of rank i's sendbuf (count elements) lands in block i of rank j's recvbuf.
  virtual void alltoall(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                        const CollectiveOptions& opts = {}) = 0;
  virtual void barrier(const CollectiveOptions& opts = {}) = 0;

  /// Collective: allocates a SharedWindow of `bytes` per rank when every rank of this
  /// communicator is on this host and the backend supports it; otherwise every rank gets
  /// nullptr (the ranks always agree). Throws only for errors on the way (IoError, Timeout).
  virtual std::shared_ptr<SharedWindow> allocateSharedWindow(size_t bytes);
};

}  // namespace kolo::comm
