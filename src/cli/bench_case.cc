// Buffers, fills, the single operation and the closed-form check of each collective that
// `kolo bench` measures, with the values of comm/closed_form.h: reductions get
// closedFormInput, the collectives that move data closedFormCode(source, destination, i).
#include "cli/bench_case.h"

#include <algorithm>
#include <cstring>

#include "comm/closed_form.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

using comm::ReduceOp;
using comm::detail::closedFormCode;

void fillSentinel(void* base, DType dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) storeElement(dtype, base, i, comm::detail::kClosedFormSentinel);
}

}  // namespace

BenchCase::BenchCase(comm::Communicator& comm, const BenchConfig& config, size_t requestedBytes)
    : comm_(comm), config_(config), rank_(comm.rank()), size_(comm.size()) {
  const size_t esize = dtypeSize(config.dtype);
  const size_t n = static_cast<size_t>(size_);
  const bool split = splitsAcrossRanks(config.collective);
  count_ = split ? requestedBytes / (esize * n) : requestedBytes / esize;
  bytes_ = (split ? count_ * n : count_) * esize;
  switch (config.collective) {
    case BenchCollective::Allreduce:
    case BenchCollective::Reduce: sendElements_ = recvElements_ = count_; break;
    case BenchCollective::Broadcast: recvElements_ = count_; break;
    case BenchCollective::Allgather:
    case BenchCollective::Gather: sendElements_ = count_; recvElements_ = count_ * n; break;
    case BenchCollective::ReduceScatter:
    case BenchCollective::Scatter: sendElements_ = count_ * n; recvElements_ = count_; break;
    case BenchCollective::Alltoall: sendElements_ = recvElements_ = count_ * n; break;
  }
  // In place, one buffer serves both roles; it must hold the larger of the two.
  if (config.inPlace && config.collective != BenchCollective::Gather && config.collective != BenchCollective::Scatter) {
    recvElements_ = std::max(sendElements_, recvElements_);
    sendElements_ = 0;
  }
  // One spare byte keeps data() non-null for empty messages.
  send_.assign(sendElements_ * esize + 1, 0);
  recv_.assign(recvElements_ * esize + 1, 0);
}

void* BenchCase::sendPtr() {
  const size_t block = count_ * dtypeSize(config_.dtype);
  if (!config_.inPlace) return send_.data();
  switch (config_.collective) {
    case BenchCollective::Allgather: return recv_.data() + block * static_cast<size_t>(rank_);
    case BenchCollective::Gather:
      return rank_ == config_.root ? recv_.data() + block * static_cast<size_t>(rank_) : send_.data();
    case BenchCollective::Scatter: return send_.data();
    default: return recv_.data();
  }
}

void* BenchCase::recvPtr() {
  if (config_.inPlace && config_.collective == BenchCollective::Scatter && rank_ == config_.root) {
    return send_.data() + count_ * dtypeSize(config_.dtype) * static_cast<size_t>(rank_);
  }
  return recv_.data();
}

void BenchCase::fillForCheck() {
  const DType dt = config_.dtype;
  const size_t n = static_cast<size_t>(size_);
  const int root = config_.root;
  void* in = sendPtr();
  void* out = recvPtr();
  fillSentinel(recv_.data(), dt, recvElements_);
  switch (config_.collective) {
    case BenchCollective::Allreduce:
    case BenchCollective::Reduce:
      comm::detail::fillClosedFormInput(in, dt, count_, config_.op, rank_, size_);
      break;
    case BenchCollective::ReduceScatter:
      comm::detail::fillClosedFormInput(in, dt, count_ * n, config_.op, rank_, size_);
      break;
    case BenchCollective::Broadcast:
      if (rank_ == root) {
        for (size_t i = 0; i < count_; ++i) storeElement(dt, out, i, closedFormCode(root, 0, i));
      }
      break;
    case BenchCollective::Allgather:
    case BenchCollective::Gather:
      for (size_t i = 0; i < count_; ++i) storeElement(dt, in, i, closedFormCode(rank_, 0, i));
      break;
    case BenchCollective::Alltoall:
      for (size_t d = 0; d < n; ++d) {
        for (size_t i = 0; i < count_; ++i)
          storeElement(dt, in, d * count_ + i, closedFormCode(rank_, static_cast<int>(d), i));
      }
      break;
    case BenchCollective::Scatter:
      if (rank_ == root) {
        for (size_t d = 0; d < n; ++d) {
          for (size_t i = 0; i < count_; ++i)
            storeElement(dt, in, d * count_ + i, closedFormCode(root, static_cast<int>(d), i));
        }
      }
      break;
  }
}

void BenchCase::fillZeros() {
  std::memset(send_.data(), 0, send_.size());
  std::memset(recv_.data(), 0, recv_.size());
}

void BenchCase::run(const comm::CollectiveOptions& options) {
  const DType dt = config_.dtype;
  switch (config_.collective) {
    case BenchCollective::Allreduce:
      comm_.allreduce(sendPtr(), recvPtr(), count_, dt, config_.op, options);
      return;
    case BenchCollective::Reduce:
      comm_.reduce(sendPtr(), recvPtr(), count_, dt, config_.op, config_.root, options);
      return;
    case BenchCollective::Broadcast: comm_.broadcast(recvPtr(), count_, dt, config_.root, options); return;
    case BenchCollective::Allgather: comm_.allgather(sendPtr(), recvPtr(), count_, dt, options); return;
    case BenchCollective::ReduceScatter:
      comm_.reduceScatter(sendPtr(), recvPtr(), count_, dt, config_.op, options);
      return;
    case BenchCollective::Alltoall: comm_.alltoall(sendPtr(), recvPtr(), count_, dt, options); return;
    case BenchCollective::Gather: comm_.gather(sendPtr(), recvPtr(), count_, dt, config_.root, options); return;
    case BenchCollective::Scatter: comm_.scatter(sendPtr(), recvPtr(), count_, dt, config_.root, options); return;
  }
}

bool BenchCase::verify() const {
  auto* self = const_cast<BenchCase*>(this);
  const void* out = self->recvPtr();
  const DType dt = config_.dtype;
  const int n = size_;
  const int root = config_.root;
  switch (config_.collective) {
    case BenchCollective::Allreduce:
      return comm::detail::closedFormMismatch(out, dt, count_, config_.op, n).empty();
    case BenchCollective::Reduce:
      return rank_ != root || comm::detail::closedFormMismatch(out, dt, count_, config_.op, n).empty();
    case BenchCollective::ReduceScatter:
      return comm::detail::closedFormMismatch(out, dt, count_, config_.op, n, static_cast<size_t>(rank_) * count_)
          .empty();
    case BenchCollective::Broadcast:
      for (size_t i = 0; i < count_; ++i) {
        if (loadElement(dt, out, i) != closedFormCode(root, 0, i)) return false;
      }
      return true;
    case BenchCollective::Gather:
      if (rank_ != root) return true;
      [[fallthrough]];
    case BenchCollective::Allgather:
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count_; ++i) {
          if (loadElement(dt, out, static_cast<size_t>(s) * count_ + i) != closedFormCode(s, 0, i)) return false;
        }
      }
      return true;
    case BenchCollective::Alltoall:
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count_; ++i) {
          if (loadElement(dt, out, static_cast<size_t>(s) * count_ + i) != closedFormCode(s, rank_, i)) return false;
        }
      }
      return true;
    case BenchCollective::Scatter:
      for (size_t i = 0; i < count_; ++i) {
        if (loadElement(dt, out, i) != closedFormCode(root, rank_, i)) return false;
      }
      return true;
  }
  return false;
}

}  // namespace kolo::cli
