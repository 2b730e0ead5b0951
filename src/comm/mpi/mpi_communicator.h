// MpiCommunicator: kolo's Communicator over an MPI communicator (a duplicate of
// MPI_COMM_WORLD or one of its splits). Non-blocking MPI calls polled against a deadline
// give every wait a Timeout; MPI status codes become kolo exceptions here and nowhere else.
#pragma once

#if KOLO_HAVE_MPI

// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "kolo/comm/communicator.h"
#include "kolo/comm/mpi.h"
#include "kolo/flight_recorder.h"

namespace kolo::comm::detail {

/// What every rank agrees on for one collective; compared across ranks when signature
/// checks are on.
struct MpiSignature {
  uint64_t sequence = 0;
  int32_t kind = 0;  // index into the collective names
  int32_t dtype = -1;
  int64_t count = 0;
  int32_t root = -1;
  int32_t op = -1;
};

/// A collective as issued on this rank: its signature, and its flight-recorder entry and
/// span start (kolo/flight_recorder.h, kolo/trace.h).
struct MpiCall : MpiSignature {
  uint64_t flightId = 0;
  int64_t beginNs = 0;
};

class MpiCommunicator final : public Communicator, public std::enable_shared_from_this<MpiCommunicator> {
 public:
  /// Takes ownership of `comm` (freed in the destructor) and sets MPI_ERRORS_RETURN on it.
  /// `context` names the communicator in the flight recorder, equal on every member (1: the
  /// first world communicator).
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, const MpiOptions& options,
                  uint32_t context = 1);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return "mpi"; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  /// Names this communicator in the flight recorder (set once, before it is used).
  void setContext(uint32_t context) { context_ = context; }

  std::shared_ptr<Communicator> split(int color, int key) override;
  /// POSIX shared memory when MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) finds the whole
  /// group on this node (not MPI_Win_allocate_shared, whose collective free could block a
  /// rank whose peer has died).
  std::shared_ptr<SharedWindow> allocateSharedWindow(size_t bytes) override;

  void send(const void* buf, size_t count, DType dtype, int peer, int tag) override;
  void recv(void* buf, size_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Work> isend(const void* buf, size_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Work> irecv(void* buf, size_t count, DType dtype, int peer, int tag) override;

  void allreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                 const CollectiveOptions& opts) override;
  std::unique_ptr<Work> iallreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                                   const CollectiveOptions& opts) override;
  void reduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
              const CollectiveOptions& opts) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveOptions& opts) override;
  std::unique_ptr<Work> ibroadcast(void* buf, size_t count, DType dtype, int root,
                                   const CollectiveOptions& opts) override;
  void allgather(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                 const CollectiveOptions& opts) override;
  void allgatherv(const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvcounts, DType dtype,
                  const CollectiveOptions& opts) override;
  void reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype, ReduceOp op,
                     const CollectiveOptions& opts) override;
  void gather(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
              const CollectiveOptions& opts) override;
  void scatter(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
               const CollectiveOptions& opts) override;
  void alltoall(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                const CollectiveOptions& opts) override;
  void barrier(const CollectiveOptions& opts) override;

  /// Polls `request` until it completes or `timeout` passes (Timeout naming `what`). After a
  /// collective's Timeout this communicator refuses further operations: MPI cannot cancel a
  /// pending collective, so the ranks would no longer agree on the order of operations.
  void waitRequest(MPI_Request& request, MPI_Status* status, const std::string& what,
                   std::chrono::milliseconds timeout, bool collective);

 private:
  std::chrono::milliseconds timeoutFor(const CollectiveOptions& opts) const;
  /// Throws if an earlier Timeout left this communicator unusable.
  void checkUsable(const char* call) const;
  /// Advances the sequence number and enters the collective in the flight recorder; with
  /// signature checks on, exchanges and compares.
  MpiCall beginCollective(int kind, DType dtype, size_t count, int root, int op, const CollectiveOptions& opts);
  /// The flight-recorder description of a collective.
  flight::Description describeForRecorder(const MpiSignature& sig) const;
  /// Ends a blocking collective's span (begun by beginCollective).
  void endSpan(const MpiCall& call) const;
  /// A non-blocking send or receive, recorded as `op` ("isend", "irecv"; nullptr: not
  /// recorded, for the blocking calls, which record themselves).
  std::unique_ptr<Work> startSend(const void* buf, size_t count, DType dtype, int peer, int tag, const char* op);
  std::unique_ptr<Work> startRecv(void* buf, size_t count, DType dtype, int peer, int tag, const char* op);
  std::string describe(const MpiSignature& sig) const;
  /// Runs one collective: MPI's blocking call, or the non-blocking one polled to a deadline.
  void runCollective(const MpiCall& call, const CollectiveOptions& opts, const std::function<int()>& blocking,
                     const std::function<int(MPI_Request*)>& nonBlocking);
  void checkRoot(int root, const char* call) const;
  void checkPeer(int peer, int tag, const char* call) const;

  // Declared first so it is destroyed last: MPI must outlive comm_.
  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  MpiOptions options_;
  uint64_t sequence_ = 0;
  uint32_t context_ = 1;
  uint32_t splits_ = 0;  // split() calls so far: with the color, names a child's context
  uint64_t windowCount_ = 0;  // names this communicator's shared windows apart
  std::string brokenBy_;  // non-empty after a Timeout
};

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
