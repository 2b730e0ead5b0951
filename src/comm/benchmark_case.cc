// Buffers, fills, the single operation and the closed-form check of each collective that
// benchmarkCollective measures, with the values of comm/closed_form.h: reductions get
// closedFormInput, the collectives that move data closedFormCode(source, destination, i).
#include "comm/benchmark_case.h"

#include <algorithm>
#include <cstring>

#include "comm/closed_form.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

void fillSentinel(void* base, DType dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) storeElement(dtype, base, i, kClosedFormSentinel);
}

}  // namespace

BenchmarkCase::BenchmarkCase(Communicator& comm, const BenchmarkOptions& options, size_t requestedBytes)
    : comm_(comm), options_(options), rank_(comm.rank()), size_(comm.size()) {
  const size_t esize = dtypeSize(options.dtype);
  const size_t n = static_cast<size_t>(size_);
  const bool split = splitsAcrossRanks(options.collective);
  count_ = split ? requestedBytes / (esize * n) : requestedBytes / esize;
  bytes_ = (split ? count_ * n : count_) * esize;
  switch (options.collective) {
    case Collective::Allreduce:
    case Collective::Reduce: sendElements_ = recvElements_ = count_; break;
    case Collective::Broadcast: recvElements_ = count_; break;
    case Collective::Allgather:
    case Collective::Gather: sendElements_ = count_; recvElements_ = count_ * n; break;
    case Collective::ReduceScatter:
    case Collective::Scatter: sendElements_ = count_ * n; recvElements_ = count_; break;
    case Collective::Alltoall: sendElements_ = recvElements_ = count_ * n; break;
  }
  // In place, one buffer serves both roles; it must hold the larger of the two.
  if (options.inPlace && options.collective != Collective::Gather && options.collective != Collective::Scatter) {
    recvElements_ = std::max(sendElements_, recvElements_);
    sendElements_ = 0;
  }
  // One spare byte keeps data() non-null for empty messages.
  send_.assign(sendElements_ * esize + 1, 0);
  recv_.assign(recvElements_ * esize + 1, 0);
}

void* BenchmarkCase::sendPtr() {
  const size_t block = count_ * dtypeSize(options_.dtype);
  if (!options_.inPlace) return send_.data();
  switch (options_.collective) {
    case Collective::Allgather: return recv_.data() + block * static_cast<size_t>(rank_);
    case Collective::Gather:
      return rank_ == options_.root ? recv_.data() + block * static_cast<size_t>(rank_) : send_.data();
    case Collective::Scatter: return send_.data();
    default: return recv_.data();
  }
}

void* BenchmarkCase::recvPtr() {
  if (options_.inPlace && options_.collective == Collective::Scatter && rank_ == options_.root) {
    return send_.data() + count_ * dtypeSize(options_.dtype) * static_cast<size_t>(rank_);
  }
  return recv_.data();
}

void BenchmarkCase::fillForCheck() {
  const DType dt = options_.dtype;
  const size_t n = static_cast<size_t>(size_);
  const int root = options_.root;
  void* in = sendPtr();
  void* out = recvPtr();
  fillSentinel(recv_.data(), dt, recvElements_);
  switch (options_.collective) {
    case Collective::Allreduce:
    case Collective::Reduce:
      fillClosedFormInput(in, dt, count_, options_.op, rank_, size_);
      break;
    case Collective::ReduceScatter:
      fillClosedFormInput(in, dt, count_ * n, options_.op, rank_, size_);
      break;
    case Collective::Broadcast:
      if (rank_ == root) {
        for (size_t i = 0; i < count_; ++i) storeElement(dt, out, i, closedFormCode(root, 0, i));
      }
      break;
    case Collective::Allgather:
    case Collective::Gather:
      for (size_t i = 0; i < count_; ++i) storeElement(dt, in, i, closedFormCode(rank_, 0, i));
      break;
    case Collective::Alltoall:
      for (size_t d = 0; d < n; ++d) {
        for (size_t i = 0; i < count_; ++i)
          storeElement(dt, in, d * count_ + i, closedFormCode(rank_, static_cast<int>(d), i));
      }
      break;
    case Collective::Scatter:
      if (rank_ == root) {
        for (size_t d = 0; d < n; ++d) {
          for (size_t i = 0; i < count_; ++i)
            storeElement(dt, in, d * count_ + i, closedFormCode(root, static_cast<int>(d), i));
        }
      }
      break;
  }
}

void BenchmarkCase::fillZeros() {
  std::memset(send_.data(), 0, send_.size());
  std::memset(recv_.data(), 0, recv_.size());
}

void BenchmarkCase::run(const CollectiveOptions& options) {
  const DType dt = options_.dtype;
  switch (options_.collective) {
    case Collective::Allreduce:
      comm_.allreduce(sendPtr(), recvPtr(), count_, dt, options_.op, options);
      return;
    case Collective::Reduce:
      comm_.reduce(sendPtr(), recvPtr(), count_, dt, options_.op, options_.root, options);
      return;
    case Collective::Broadcast: comm_.broadcast(recvPtr(), count_, dt, options_.root, options); return;
    case Collective::Allgather: comm_.allgather(sendPtr(), recvPtr(), count_, dt, options); return;
    case Collective::ReduceScatter:
      comm_.reduceScatter(sendPtr(), recvPtr(), count_, dt, options_.op, options);
      return;
    case Collective::Alltoall: comm_.alltoall(sendPtr(), recvPtr(), count_, dt, options); return;
    case Collective::Gather: comm_.gather(sendPtr(), recvPtr(), count_, dt, options_.root, options); return;
    case Collective::Scatter: comm_.scatter(sendPtr(), recvPtr(), count_, dt, options_.root, options); return;
  }
}

bool BenchmarkCase::verify() const {
  auto* self = const_cast<BenchmarkCase*>(this);
  const void* out = self->recvPtr();
  const DType dt = options_.dtype;
  const int n = size_;
  const int root = options_.root;
  switch (options_.collective) {
    case Collective::Allreduce:
      return closedFormMismatch(out, dt, count_, options_.op, n).empty();
    case Collective::Reduce:
      return rank_ != root || closedFormMismatch(out, dt, count_, options_.op, n).empty();
    case Collective::ReduceScatter:
      return closedFormMismatch(out, dt, count_, options_.op, n, static_cast<size_t>(rank_) * count_)
          .empty();
    case Collective::Broadcast:
      for (size_t i = 0; i < count_; ++i) {
        if (loadElement(dt, out, i) != closedFormCode(root, 0, i)) return false;
      }
      return true;
    case Collective::Gather:
      if (rank_ != root) return true;
      [[fallthrough]];
    case Collective::Allgather:
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count_; ++i) {
          if (loadElement(dt, out, static_cast<size_t>(s) * count_ + i) != closedFormCode(s, 0, i)) return false;
        }
      }
      return true;
    case Collective::Alltoall:
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count_; ++i) {
          if (loadElement(dt, out, static_cast<size_t>(s) * count_ + i) != closedFormCode(s, rank_, i)) return false;
        }
      }
      return true;
    case Collective::Scatter:
      for (size_t i = 0; i < count_; ++i) {
        if (loadElement(dt, out, i) != closedFormCode(root, rank_, i)) return false;
      }
      return true;
  }
  return false;
}

}  // namespace kolo::comm::detail
