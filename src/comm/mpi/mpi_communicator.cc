// The MPI backend's communicator: each kolo call maps to one MPI call (MPI_IN_PLACE for
// in place, MPI_Comm_split for split, user ops for f16/bf16, Sum + divide for Avg); waits
// poll MPI_Test so that every one has a deadline; optional cross-rank signature checks.
#include "comm/mpi/mpi_communicator.h"

#if KOLO_HAVE_MPI

#include <sched.h>

#include <chrono>
#include <cstring>

#include "comm/algorithms/reduce_kernels.h"
#include "comm/mpi/mpi_work.h"
#include "comm/observed_ops.h"
#include "comm/shared_window.h"
#include "kolo/error.h"
#include "kolo/trace.h"

namespace kolo::comm::detail {
namespace {

enum Kind : int32_t {
  kAllreduce, kReduce, kBroadcast, kAllgather, kAllgatherv, kReduceScatter, kGather, kScatter, kAlltoall,
  kBarrier, kKindCount
};
const char* const kKindNames[kKindCount] = {"allreduce", "reduce",  "broadcast", "allgather", "allgatherv",
                                            "reduceScatter", "gather", "scatter", "alltoall", "barrier"};
const char* const kOpNames[] = {"sum", "prod", "min", "max", "avg"};

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (aBytes == 0 || bBytes == 0 || a == nullptr || b == nullptr) return false;
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return pa < pb + bBytes && pb < pa + aBytes;
}

const char* at(const void* base, size_t offsetBytes) { return static_cast<const char*>(base) + offsetBytes; }

// A private copy of `bytes` at `src`, for overlapping buffers that MPI_IN_PLACE cannot express.
std::vector<char> copyOf(const void* src, size_t bytes) {
  std::vector<char> copy(bytes);
  if (bytes) std::memcpy(copy.data(), src, bytes);
  return copy;
}

// Runs `start` (an MPI call that issues a non-blocking operation); when it throws, marks the
// operation's record failed before the error goes on.
template <class Start>
void startRecorded(PendingOp& record, Start&& start) {
  try {
    start();
  } catch (const std::exception& e) {
    record.fail(e, true);
    throw;
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, const MpiOptions& options,
                                 uint32_t context)
    : runtime_(std::move(runtime)), comm_(comm), options_(options), context_(context) {
  mpiCheck(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", -1);
  mpiCheck(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1);
  mpiCheck(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", rank_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  // After a collective timed out its request is still pending on comm_, and freeing the
  // communicator under it is unsafe: the handle is left for MPI_Finalize instead.
  if (!finalised && comm_ != MPI_COMM_NULL && brokenBy_.empty()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::setTimeout(std::chrono::milliseconds timeout) {
  KOLO_CHECK(timeout.count() > 0, "MPI communicator timeout must be positive, got ", timeout.count(), " ms");
  options_.timeout = timeout;
}

std::chrono::milliseconds MpiCommunicator::timeoutFor(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : options_.timeout;
}

void MpiCommunicator::checkUsable(const char* call) const {
  if (!brokenBy_.empty()) {
    KOLO_THROW(Error, "MPI backend: ", call, " on rank ", rank_, " refused: this communicator is unusable after ",
               brokenBy_, " timed out (MPI cannot cancel a pending collective)");
  }
}

void MpiCommunicator::checkRoot(int root, const char* call) const {
  if (root < 0 || root >= size_) {
    KOLO_THROW(InvalidArgument, call, ": root ", root, " out of range for a communicator of size ", size_);
  }
}

void MpiCommunicator::checkPeer(int peer, int tag, const char* call) const {
  if (peer < 0 || peer >= size_) {
    KOLO_THROW(InvalidArgument, call, " on rank ", rank_, ": peer ", peer, " out of range for size ", size_);
  }
  if (tag < 0) KOLO_THROW(InvalidArgument, call, " on rank ", rank_, ": negative tag ", tag);
}

void MpiCommunicator::waitRequest(MPI_Request& request, MPI_Status* status, const std::string& what,
                                  std::chrono::milliseconds timeout, bool collective) {
  const detail::BlockedTime blocked;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  // Spin briefly (latency), then yield between polls so that oversubscribed ranks on few
  // cores let their peers run; the clock is read once per batch of polls.
  for (unsigned polls = 1;; ++polls) {
    int flag = 0;
    const int rc = MPI_Test(&request, &flag, status ? status : MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) throwMpiError(rc, what + " on rank " + std::to_string(rank_));
    if (flag) return;
    if (polls % 64 == 0) {
      if (Clock::now() >= deadline) {
        if (!collective) {
          KOLO_THROW(Timeout, what, " on rank ", rank_, " of ", size_, " did not complete within ",
                     timeout.count(), " ms (still pending: wait again or abandon the communicator)");
        }
        brokenBy_ = what;
        KOLO_THROW(Timeout, what, " on rank ", rank_, " of ", size_, " did not complete within ", timeout.count(),
                   " ms (MPI cannot tell which ranks are missing; the communicator is now unusable)");
      }
      if (polls >= 1024) sched_yield();
    }
  }
}

flight::Description MpiCommunicator::describeForRecorder(const MpiSignature& sig) const {
  flight::Description d;
  d.seq = static_cast<int64_t>(sig.sequence);
  d.context = context_;
  d.groupRank = rank_;
  d.groupSize = size_;
  d.op = kKindNames[sig.kind];
  d.dtype = sig.dtype >= 0 ? dtypeName(static_cast<DType>(sig.dtype)) : "";
  d.reduce = sig.op >= 0 && sig.op < 5 ? kOpNames[sig.op] : "";
  // What was asked of Open MPI (KOLO_ALGO applies to all-reduces only).
  d.algorithm = sig.kind == kAllreduce ? algorithmName(options_.algorithm) : "auto";
  d.count = sig.count;
  d.bytes = sig.dtype >= 0 ? sig.count * static_cast<int64_t>(dtypeSize(static_cast<DType>(sig.dtype))) : 0;
  d.root = sig.root;
  return d;
}

void MpiCommunicator::endSpan(const MpiCall& call) const {
  if (!trace::enabled() || call.beginNs == 0) return;
  const flight::Description d = describeForRecorder(call);
  trace::Span span;
  span.name = d.op;
  span.category = "comm";
  span.begin = call.beginNs;
  span.end = trace::nowNs();
  span.seq = d.seq;
  span.bytes = d.bytes;
  span.detail = d.algorithm;
  trace::record(span);
}

MpiCall MpiCommunicator::beginCollective(int kind, DType dtype, size_t count, int root, int op,
                                         const CollectiveOptions& opts) {
  checkUsable(kKindNames[kind]);
  MpiCall call;
  MpiSignature& sig = call;
  sig.sequence = ++sequence_;
  sig.kind = kind;
  sig.dtype = kind == kBarrier ? -1 : static_cast<int32_t>(dtype);
  sig.count = static_cast<int64_t>(count);
  sig.root = root;
  sig.op = op;
  if (flight::enabled()) call.flightId = flight::begin(describeForRecorder(sig), true);
  if (trace::enabled()) call.beginNs = trace::nowNs();
  if (!options_.checkSignatures || size_ == 1) return call;

  std::vector<MpiSignature> all(static_cast<size_t>(size_));
  try {
    MPI_Request request;
    mpiCheck(MPI_Iallgather(&sig, sizeof sig, MPI_BYTE, all.data(), sizeof sig, MPI_BYTE, comm_, &request),
             "MPI_Iallgather (signature check)", rank_);
    waitRequest(request, nullptr, "signature check of " + describe(sig), timeoutFor(opts), true);
    for (int r = 0; r < size_; ++r) {
      const MpiSignature& other = all[static_cast<size_t>(r)];
      if (std::memcmp(&other, &sig, sizeof sig) != 0) {
        KOLO_THROW(Mismatch, "collective mismatch: rank ", rank_, " called ", describe(sig), " but rank ", r,
                   " called ", describe(other));
      }
    }
  } catch (const std::exception& e) {
    recordFailure(call.flightId, e);
    endSpan(call);
    throw;
  }
  return call;
}

std::string MpiCommunicator::describe(const MpiSignature& sig) const {
  // Appends only: GCC 12 warns falsely (-Wrestrict) on `"literal" + std::to_string(...)`.
  std::string text = "#";
  text += std::to_string(sig.sequence);
  text += ' ';
  text += (sig.kind >= 0 && sig.kind < kKindCount) ? kKindNames[sig.kind] : "unknown";
  text += "(count=";
  text += std::to_string(sig.count);
  if (sig.dtype >= 0) {
    text += ", ";
    text += dtypeName(static_cast<DType>(sig.dtype));
  }
  if (sig.op >= 0 && sig.op < 5) {
    text += ", ";
    text += kOpNames[sig.op];
  }
  if (sig.root >= 0) {
    text += ", root=";
    text += std::to_string(sig.root);
  }
  return text + ")";
}

void MpiCommunicator::runCollective(const MpiCall& call, const CollectiveOptions& opts,
                                    const std::function<int()>& blocking,
                                    const std::function<int(MPI_Request*)>& nonBlocking) {
  try {
    if (options_.blockingCollectives) {
      const int rc = blocking();
      if (rc != MPI_SUCCESS) throwMpiError(rc, describe(call) + " on rank " + std::to_string(rank_));
    } else {
      MPI_Request request;
      const int rc = nonBlocking(&request);
      if (rc != MPI_SUCCESS) throwMpiError(rc, describe(call) + " on rank " + std::to_string(rank_));
      waitRequest(request, nullptr, describe(call), timeoutFor(opts), true);
    }
  } catch (const std::exception& e) {
    recordFailure(call.flightId, e);
    endSpan(call);
    throw;
  }
  flight::finished(call.flightId);
  endSpan(call);
}

std::shared_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  checkUsable("split");
  MPI_Comm child = MPI_COMM_NULL;
  mpiCheck(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split", rank_);
  // Every member of the child saw the same split() calls and color: its context is theirs.
  const uint32_t index = ++splits_;
  if (child == MPI_COMM_NULL) return nullptr;
  uint64_t mixed = (static_cast<uint64_t>(context_) << 32) ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull) ^
                   (static_cast<uint64_t>(static_cast<uint32_t>(color)) * 0xC2B2AE3D27D4EB4Full);
  mixed ^= mixed >> 29;
  const uint32_t context = static_cast<uint32_t>(mixed) | 2u;  // never 1 (the world)
  return std::make_shared<MpiCommunicator>(runtime_, child, options_, context);
}

std::shared_ptr<SharedWindow> MpiCommunicator::allocateSharedWindow(size_t bytes) {
  checkUsable("allocateSharedWindow");
  MPI_Comm node = MPI_COMM_NULL;
  mpiCheck(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
           "MPI_Comm_split_type", rank_);
  int nodeSize = 0;
  MPI_Comm_size(node, &nodeSize);
  MPI_Comm_free(&node);
  // Every rank sees the whole group on its node, or none does.
  if (nodeSize != size_) return nullptr;
  return allocatePosixSharedWindow(
      *this, bytes, reinterpret_cast<uintptr_t>(this) * 1000003u + windowCount_++);
}

// ---- point to point ----

// Blocking sends and receives are one span each on the calling thread; non-blocking ones an
// entry and an asynchronous span, finished by whichever wait() or test() sees them complete.

void MpiCommunicator::send(const void* buf, size_t count, DType dtype, int peer, int tag) {
  observedBlocking(pointToPoint("send", rank_, size_, context_, count, dtype, peer),
                   [&] { startSend(buf, count, dtype, peer, tag, nullptr)->wait(options_.timeout); });
}

void MpiCommunicator::recv(void* buf, size_t count, DType dtype, int peer, int tag) {
  observedBlocking(pointToPoint("recv", rank_, size_, context_, count, dtype, peer),
                   [&] { startRecv(buf, count, dtype, peer, tag, nullptr)->wait(options_.timeout); });
}

std::unique_ptr<Work> MpiCommunicator::isend(const void* buf, size_t count, DType dtype, int peer, int tag) {
  return startSend(buf, count, dtype, peer, tag, "isend");
}

std::unique_ptr<Work> MpiCommunicator::irecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  return startRecv(buf, count, dtype, peer, tag, "irecv");
}

std::unique_ptr<Work> MpiCommunicator::startSend(const void* buf, size_t count, DType dtype, int peer, int tag,
                                                 const char* op) {
  checkUsable("send");
  checkPeer(peer, tag, "send");
  PendingOp record = op ? PendingOp(pointToPoint(op, rank_, size_, context_, count, dtype, peer)) : PendingOp();
  MPI_Request request;
  startRecorded(record, [&] {
    mpiCheck(MPI_Isend(buf, mpiCount(count, "send"), mpiDatatype(dtype), peer, tag, comm_, &request), "MPI_Isend",
             rank_);
  });
  return std::make_unique<MpiWork>(shared_from_this(), request,
                                   "send of " + std::to_string(count) + " " + dtypeName(dtype) + " to peer " +
                                       std::to_string(peer) + " tag " + std::to_string(tag),
                                   nullptr, false, std::move(record));
}

std::unique_ptr<Work> MpiCommunicator::startRecv(void* buf, size_t count, DType dtype, int peer, int tag,
                                                 const char* op) {
  checkUsable("recv");
  if (peer != kAnySource) checkPeer(peer, tag, "recv");
  if (tag < 0) KOLO_THROW(InvalidArgument, "recv on rank ", rank_, ": negative tag ", tag);
  PendingOp record = op ? PendingOp(pointToPoint(op, rank_, size_, context_, count, dtype, peer)) : PendingOp();
  MPI_Request request;
  const MPI_Datatype type = mpiDatatype(dtype);
  startRecorded(record, [&] {
    mpiCheck(MPI_Irecv(buf, mpiCount(count, "recv"), type, peer == kAnySource ? MPI_ANY_SOURCE : peer, tag, comm_,
                       &request),
             "MPI_Irecv", rank_);
  });
  std::string what = "recv of " + std::to_string(count) + " " + dtypeName(dtype) + " from " +
                     (peer == kAnySource ? std::string("any peer") : "peer " + std::to_string(peer)) + " tag " +
                     std::to_string(tag);
  const int self = rank_;
  auto finish = [what, type, count, self](const MPI_Status& status) {
    int received = 0;
    MPI_Get_count(&status, type, &received);
    if (static_cast<size_t>(received) != count) {
      KOLO_THROW(Mismatch, what, " on rank ", self, ": the message held ", received, " elements, expected ", count);
    }
  };
  auto work = std::make_unique<MpiWork>(shared_from_this(), request, what, finish, false, std::move(record));
  work->markReceive();
  return work;
}

// ---- collectives ----

void MpiCommunicator::allreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op,
                                const CollectiveOptions& opts) {
  const auto sig = beginCollective(kAllreduce, dtype, count, -1, static_cast<int>(op), opts);
  const int n = mpiCount(count, "allreduce");
  const MPI_Datatype type = mpiDatatype(dtype);
  const MPI_Op mop = runtime_->reduceOp(dtype, op);
  const void* src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
  runCollective(
      sig, opts, [&] { return MPI_Allreduce(src, recvbuf, n, type, mop, comm_); },
      [&](MPI_Request* r) { return MPI_Iallreduce(src, recvbuf, n, type, mop, comm_, r); });
  if (op == ReduceOp::Avg) finishAvg(recvbuf, count, dtype, size_);
}

std::unique_ptr<Work> MpiCommunicator::iallreduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                                                  ReduceOp op, const CollectiveOptions& opts) {
  const auto sig = beginCollective(kAllreduce, dtype, count, -1, static_cast<int>(op), opts);
  const int n = mpiCount(count, "iallreduce");
  MPI_Request request;
  PendingOp record(describeForRecorder(sig), sig.flightId, sig.beginNs ? sig.beginNs : trace::nowNs());
  startRecorded(record, [&] {
    const int rc = MPI_Iallreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, n, mpiDatatype(dtype),
                                  runtime_->reduceOp(dtype, op), comm_, &request);
    if (rc != MPI_SUCCESS) throwMpiError(rc, describe(sig) + " on rank " + std::to_string(rank_));
  });
  MpiWork::Finish finish;
  if (op == ReduceOp::Avg) {
    const int divisor = size_;
    finish = [recvbuf, count, dtype, divisor](const MPI_Status&) { finishAvg(recvbuf, count, dtype, divisor); };
  }
  return std::make_unique<MpiWork>(shared_from_this(), request, describe(sig), finish, true, std::move(record));
}

void MpiCommunicator::reduce(const void* sendbuf, void* recvbuf, size_t count, DType dtype, ReduceOp op, int root,
                             const CollectiveOptions& opts) {
  checkRoot(root, "reduce");
  const auto sig = beginCollective(kReduce, dtype, count, root, static_cast<int>(op), opts);
  const int n = mpiCount(count, "reduce");
  const MPI_Datatype type = mpiDatatype(dtype);
  const MPI_Op mop = runtime_->reduceOp(dtype, op);
  const bool isRoot = rank_ == root;
  const void* src = (isRoot && sendbuf == recvbuf) ? MPI_IN_PLACE : sendbuf;
  void* dst = isRoot ? recvbuf : nullptr;
  runCollective(
      sig, opts, [&] { return MPI_Reduce(src, dst, n, type, mop, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce(src, dst, n, type, mop, root, comm_, r); });
  if (isRoot && op == ReduceOp::Avg) finishAvg(recvbuf, count, dtype, size_);
}

void MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveOptions& opts) {
  checkRoot(root, "broadcast");
  const auto sig = beginCollective(kBroadcast, dtype, count, root, -1, opts);
  const int n = mpiCount(count, "broadcast");
  const MPI_Datatype type = mpiDatatype(dtype);
  runCollective(
      sig, opts, [&] { return MPI_Bcast(buf, n, type, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ibcast(buf, n, type, root, comm_, r); });
}

std::unique_ptr<Work> MpiCommunicator::ibroadcast(void* buf, size_t count, DType dtype, int root,
                                                  const CollectiveOptions& opts) {
  checkRoot(root, "ibroadcast");
  const auto sig = beginCollective(kBroadcast, dtype, count, root, -1, opts);
  MPI_Request request;
  PendingOp record(describeForRecorder(sig), sig.flightId, sig.beginNs ? sig.beginNs : trace::nowNs());
  startRecorded(record, [&] {
    const int rc = MPI_Ibcast(buf, mpiCount(count, "ibroadcast"), mpiDatatype(dtype), root, comm_, &request);
    if (rc != MPI_SUCCESS) throwMpiError(rc, describe(sig) + " on rank " + std::to_string(rank_));
  });
  return std::make_unique<MpiWork>(shared_from_this(), request, describe(sig), nullptr, true, std::move(record));
}

void MpiCommunicator::allgather(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                                const CollectiveOptions& opts) {
  const auto sig = beginCollective(kAllgather, dtype, count, -1, -1, opts);
  const int n = mpiCount(count, "allgather");
  mpiCount(count * static_cast<size_t>(size_), "allgather (total)");
  const MPI_Datatype type = mpiDatatype(dtype);
  const size_t block = count * dtypeSize(dtype);
  // In place when this rank's contribution already sits in its block of recvbuf; any other
  // overlap is served from a private copy of the contribution.
  std::vector<char> copy;
  const void* src = sendbuf;
  if (sendbuf == at(recvbuf, block * static_cast<size_t>(rank_))) {
    src = MPI_IN_PLACE;
  } else if (overlaps(sendbuf, block, recvbuf, block * static_cast<size_t>(size_))) {
    copy = copyOf(sendbuf, block);
    src = copy.data();
  }
  runCollective(
      sig, opts, [&] { return MPI_Allgather(src, n, type, recvbuf, n, type, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(src, n, type, recvbuf, n, type, comm_, r); });
}

void MpiCommunicator::allgatherv(const void* sendbuf, void* recvbuf, const std::vector<size_t>& recvcounts,
                                 DType dtype, const CollectiveOptions& opts) {
  KOLO_CHECK_EQ(recvcounts.size(), static_cast<size_t>(size_), "allgatherv on rank ", rank_,
                ": one receive count per rank");
  size_t total = 0;
  std::vector<int> counts(recvcounts.size());
  std::vector<int> displs(recvcounts.size());
  for (size_t r = 0; r < recvcounts.size(); ++r) {
    counts[r] = mpiCount(recvcounts[r], "allgatherv");
    displs[r] = mpiCount(total, "allgatherv (displacement)");
    total += recvcounts[r];
  }
  mpiCount(total, "allgatherv (total)");
  const auto sig = beginCollective(kAllgatherv, dtype, total, -1, -1, opts);
  const MPI_Datatype type = mpiDatatype(dtype);
  const size_t esize = dtypeSize(dtype);
  const size_t mine = recvcounts[static_cast<size_t>(rank_)] * esize;
  std::vector<char> copy;
  const void* src = sendbuf;
  if (sendbuf == at(recvbuf, static_cast<size_t>(displs[static_cast<size_t>(rank_)]) * esize)) {
    src = MPI_IN_PLACE;
  } else if (overlaps(sendbuf, mine, recvbuf, total * esize)) {
    copy = copyOf(sendbuf, mine);
    src = copy.data();
  }
  const int myCount = counts[static_cast<size_t>(rank_)];
  runCollective(
      sig, opts,
      [&] { return MPI_Allgatherv(src, myCount, type, recvbuf, counts.data(), displs.data(), type, comm_); },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(src, myCount, type, recvbuf, counts.data(), displs.data(), type, comm_, r);
      });
}

void MpiCommunicator::reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DType dtype, ReduceOp op,
                                    const CollectiveOptions& opts) {
  const auto sig = beginCollective(kReduceScatter, dtype, recvcount, -1, static_cast<int>(op), opts);
  const int n = mpiCount(recvcount, "reduceScatter");
  mpiCount(recvcount * static_cast<size_t>(size_), "reduceScatter (total)");
  const MPI_Datatype type = mpiDatatype(dtype);
  const MPI_Op mop = runtime_->reduceOp(dtype, op);
  const size_t block = recvcount * dtypeSize(dtype);
  // sendbuf == recvbuf: MPI_IN_PLACE (the result replaces the first block); other overlaps
  // reduce from a private copy of the input.
  std::vector<char> copy;
  const void* src = sendbuf;
  if (sendbuf == recvbuf) {
    src = MPI_IN_PLACE;
  } else if (overlaps(sendbuf, block * static_cast<size_t>(size_), recvbuf, block)) {
    copy = copyOf(sendbuf, block * static_cast<size_t>(size_));
    src = copy.data();
  }
  runCollective(
      sig, opts, [&] { return MPI_Reduce_scatter_block(src, recvbuf, n, type, mop, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(src, recvbuf, n, type, mop, comm_, r); });
  if (op == ReduceOp::Avg) finishAvg(recvbuf, recvcount, dtype, size_);
}

void MpiCommunicator::gather(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
                             const CollectiveOptions& opts) {
  checkRoot(root, "gather");
  const auto sig = beginCollective(kGather, dtype, count, root, -1, opts);
  const int n = mpiCount(count, "gather");
  mpiCount(count * static_cast<size_t>(size_), "gather (total)");
  const MPI_Datatype type = mpiDatatype(dtype);
  const size_t block = count * dtypeSize(dtype);
  const bool isRoot = rank_ == root;
  std::vector<char> copy;
  const void* src = sendbuf;
  void* dst = isRoot ? recvbuf : nullptr;
  if (isRoot && sendbuf == at(recvbuf, block * static_cast<size_t>(root))) {
    src = MPI_IN_PLACE;
  } else if (isRoot && overlaps(sendbuf, block, recvbuf, block * static_cast<size_t>(size_))) {
    copy = copyOf(sendbuf, block);
    src = copy.data();
  }
  runCollective(
      sig, opts, [&] { return MPI_Gather(src, n, type, dst, n, type, root, comm_); },
      [&](MPI_Request* r) { return MPI_Igather(src, n, type, dst, n, type, root, comm_, r); });
}

void MpiCommunicator::scatter(const void* sendbuf, void* recvbuf, size_t count, DType dtype, int root,
                              const CollectiveOptions& opts) {
  checkRoot(root, "scatter");
  const auto sig = beginCollective(kScatter, dtype, count, root, -1, opts);
  const int n = mpiCount(count, "scatter");
  mpiCount(count * static_cast<size_t>(size_), "scatter (total)");
  const MPI_Datatype type = mpiDatatype(dtype);
  const size_t block = count * dtypeSize(dtype);
  const bool isRoot = rank_ == root;
  std::vector<char> copy;
  const void* src = isRoot ? sendbuf : nullptr;
  void* dst = recvbuf;
  if (isRoot && recvbuf == at(sendbuf, block * static_cast<size_t>(root))) {
    dst = MPI_IN_PLACE;
  } else if (isRoot && overlaps(sendbuf, block * static_cast<size_t>(size_), recvbuf, block)) {
    copy = copyOf(sendbuf, block * static_cast<size_t>(size_));
    src = copy.data();
  }
  runCollective(
      sig, opts, [&] { return MPI_Scatter(src, n, type, dst, n, type, root, comm_); },
      [&](MPI_Request* r) { return MPI_Iscatter(src, n, type, dst, n, type, root, comm_, r); });
}

void MpiCommunicator::alltoall(const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                               const CollectiveOptions& opts) {
  const auto sig = beginCollective(kAlltoall, dtype, count, -1, -1, opts);
  const int n = mpiCount(count, "alltoall");
  const size_t total = count * static_cast<size_t>(size_) * dtypeSize(dtype);
  mpiCount(count * static_cast<size_t>(size_), "alltoall (total)");
  const MPI_Datatype type = mpiDatatype(dtype);
  // In place (or any overlap) runs from a private copy of the input: the non-blocking
  // all-to-all of Open MPI 4.1 does not take MPI_IN_PLACE.
  std::vector<char> copy;
  const void* src = sendbuf;
  if (overlaps(sendbuf, total, recvbuf, total)) {
    copy = copyOf(sendbuf, total);
    src = copy.data();
  }
  runCollective(
      sig, opts, [&] { return MPI_Alltoall(src, n, type, recvbuf, n, type, comm_); },
      [&](MPI_Request* r) { return MPI_Ialltoall(src, n, type, recvbuf, n, type, comm_, r); });
}

void MpiCommunicator::barrier(const CollectiveOptions& opts) {
  const auto sig = beginCollective(kBarrier, DType::U8, 0, -1, -1, opts);
  runCollective(
      sig, opts, [&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
}

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
