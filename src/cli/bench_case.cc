// Buffers, fills, the single operation and the closed-form check of each collective that
// `kolo bench` measures. Values are small integers, exact in every dtype: rank r's element
// i of a reduction is (r + 1) + i mod 3 (sum, min, max), 2(r + 1) + i mod 3 (avg), or 1 with
// one rank holding 2 on odd i (prod); data-movement collectives carry (7 src + 3 dst + i) mod 97.
#include "cli/bench_case.h"

#include <cmath>
#include <cstring>

#include "kolo/error.h"

namespace kolo::cli {
namespace {

using comm::ReduceOp;

constexpr double kSentinel = 99;  // never a valid code (< 97) nor a reduction result here

double contribution(ReduceOp op, int rank, int ranks, size_t i) {
  const double k = static_cast<double>(i % 3);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Min:
    case ReduceOp::Max: return (rank + 1) + k;
    case ReduceOp::Avg: return 2.0 * (rank + 1) + k;
    case ReduceOp::Prod: return (i % 2 == 1 && static_cast<size_t>(rank) == (i / 2) % ranks) ? 2.0 : 1.0;
  }
  return 0;
}

double expectedReduction(ReduceOp op, int n, size_t i) {
  const double k = static_cast<double>(i % 3);
  switch (op) {
    case ReduceOp::Sum: return n * (n + 1) / 2.0 + n * k;
    case ReduceOp::Min: return 1 + k;
    case ReduceOp::Max: return n + k;
    case ReduceOp::Avg: return (n + 1) + k;
    case ReduceOp::Prod: return i % 2 == 1 ? 2.0 : 1.0;
  }
  return 0;
}

double code(int src, int dst, size_t i) { return static_cast<double>((src * 7 + dst * 3 + i) % 97); }

// Relative tolerance: algorithms may order or prescale (avg) differently, which rounds in
// the floating types; integer types must be exact.
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return 1e-5;
    case DType::F64: return 1e-12;
    case DType::F16: return 4e-3;
    case DType::BF16: return 2e-2;
    default: return 0;
  }
}

bool near(double got, double want, DType dtype) { return std::fabs(got - want) <= tolerance(dtype) * std::fabs(want); }

void fillSentinel(void* base, DType dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) storeElement(dtype, base, i, kSentinel);
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
      for (size_t i = 0; i < count_; ++i) storeElement(dt, in, i, contribution(config_.op, rank_, size_, i));
      break;
    case BenchCollective::ReduceScatter:
      for (size_t i = 0; i < count_ * n; ++i) storeElement(dt, in, i, contribution(config_.op, rank_, size_, i));
      break;
    case BenchCollective::Broadcast:
      if (rank_ == root) {
        for (size_t i = 0; i < count_; ++i) storeElement(dt, out, i, code(root, 0, i));
      }
      break;
    case BenchCollective::Allgather:
    case BenchCollective::Gather:
      for (size_t i = 0; i < count_; ++i) storeElement(dt, in, i, code(rank_, 0, i));
      break;
    case BenchCollective::Alltoall:
      for (size_t d = 0; d < n; ++d) {
        for (size_t i = 0; i < count_; ++i) storeElement(dt, in, d * count_ + i, code(rank_, static_cast<int>(d), i));
      }
      break;
    case BenchCollective::Scatter:
      if (rank_ == root) {
        for (size_t d = 0; d < n; ++d) {
          for (size_t i = 0; i < count_; ++i) storeElement(dt, in, d * count_ + i, code(root, static_cast<int>(d), i));
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
      for (size_t i = 0; i < count_; ++i) {
        if (!near(loadElement(dt, out, i), expectedReduction(config_.op, n, i), dt)) return false;
      }
      return true;
    case BenchCollective::Reduce:
      if (rank_ != root) return true;
      for (size_t i = 0; i < count_; ++i) {
        if (!near(loadElement(dt, out, i), expectedReduction(config_.op, n, i), dt)) return false;
      }
      return true;
    case BenchCollective::ReduceScatter:
      for (size_t j = 0; j < count_; ++j) {
        const size_t global = static_cast<size_t>(rank_) * count_ + j;
        if (!near(loadElement(dt, out, j), expectedReduction(config_.op, n, global), dt)) return false;
      }
      return true;
    case BenchCollective::Broadcast:
      for (size_t i = 0; i < count_; ++i) {
        if (loadElement(dt, out, i) != code(root, 0, i)) return false;
      }
      return true;
    case BenchCollective::Gather:
      if (rank_ != root) return true;
      [[fallthrough]];
    case BenchCollective::Allgather:
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count_; ++i) {
          if (loadElement(dt, out, static_cast<size_t>(s) * count_ + i) != code(s, 0, i)) return false;
        }
      }
      return true;
    case BenchCollective::Alltoall:
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count_; ++i) {
          if (loadElement(dt, out, static_cast<size_t>(s) * count_ + i) != code(s, rank_, i)) return false;
        }
      }
      return true;
    case BenchCollective::Scatter:
      for (size_t i = 0; i < count_; ++i) {
        if (loadElement(dt, out, i) != code(root, rank_, i)) return false;
      }
      return true;
  }
  return false;
}

}  // namespace kolo::cli
