// The communication hook's per-rank state in checkpoints (rank 0 writes them, so the ranks'
// states travel to it and back as flat messages).
#include "train/compression_state.h"

#include <cstring>
#include <string>
#include <vector>

#include "kolo/error.h"

namespace kolo::train::detail {
namespace {

constexpr const char* kPrefix = "compress.rank";

// Named tensors as three messages: per entry [dtype, ndim, dims...], the names joined by
// '\n', and every value widened to f64 (exact for the f32 and integer state hooks keep).
struct Packed {
  std::vector<int64_t> meta;
  std::string names;
  std::vector<double> values;
};

Packed pack(const parallel::NamedTensors& tensors) {
  Packed out;
  for (const auto& [name, t] : tensors) {
    out.meta.push_back(static_cast<int64_t>(t.dtype()));
    out.meta.push_back(static_cast<int64_t>(t.shape().size()));
    for (int64_t d : t.shape()) out.meta.push_back(d);
    out.names += name + "\n";
    const auto v = t.contiguous().toDoubleVector();
    out.values.insert(out.values.end(), v.begin(), v.end());
  }
  return out;
}

parallel::NamedTensors unpack(const Packed& in, const std::string& source) {
  parallel::NamedTensors out;
  size_t m = 0, v = 0, from = 0;
  while (from < in.names.size()) {
    const size_t end = in.names.find('\n', from);
    KOLO_CHECK(end != std::string::npos && m + 2 <= in.meta.size(), "compression state from ",
               source, " is malformed");
    const std::string name = in.names.substr(from, end - from);
    from = end + 1;
    const auto dtype = static_cast<DType>(in.meta[m]);
    const auto ndim = static_cast<size_t>(in.meta[m + 1]);
    m += 2;
    KOLO_CHECK(m + ndim <= in.meta.size(), "compression state from ", source, " is malformed");
    Shape shape(in.meta.begin() + static_cast<std::ptrdiff_t>(m),
                in.meta.begin() + static_cast<std::ptrdiff_t>(m + ndim));
    m += ndim;
    Tensor t = Tensor::empty(shape, dtype);
    const auto numel = static_cast<size_t>(t.numel());
    KOLO_CHECK(v + numel <= in.values.size(), "compression state from ", source, " is malformed");
    for (size_t i = 0; i < numel; ++i) storeElement(dtype, t.rawData(), i, in.values[v + i]);
    v += numel;
    out.emplace_back(name, std::move(t));
  }
  return out;
}

void sendPacked(comm::Communicator& comm, const Packed& p, int peer) {
  int64_t sizes[3] = {static_cast<int64_t>(p.meta.size()), static_cast<int64_t>(p.names.size()),
                      static_cast<int64_t>(p.values.size())};
  comm.send(sizes, 3, DType::I64, peer);
  comm.send(p.meta.data(), p.meta.size(), DType::I64, peer);
  comm.send(p.names.data(), p.names.size(), DType::U8, peer);
  comm.send(p.values.data(), p.values.size(), DType::F64, peer);
}

Packed recvPacked(comm::Communicator& comm, int peer) {
  int64_t sizes[3] = {0, 0, 0};
  comm.recv(sizes, 3, DType::I64, peer);
  Packed p;
  p.meta.resize(static_cast<size_t>(sizes[0]));
  p.names.resize(static_cast<size_t>(sizes[1]));
  p.values.resize(static_cast<size_t>(sizes[2]));
  comm.recv(p.meta.data(), p.meta.size(), DType::I64, peer);
  comm.recv(p.names.data(), p.names.size(), DType::U8, peer);
  comm.recv(p.values.data(), p.values.size(), DType::F64, peer);
  return p;
}

parallel::CommHook* hookOf(parallel::Strategy& strategy) {
  parallel::Reducer* reducer = strategy.reducer();
  return reducer ? reducer->commHook() : nullptr;
}

}  // namespace

parallel::NamedTensors gatherCompressionState(comm::Communicator* comm,
                                              parallel::Strategy& strategy) {
  parallel::CommHook* hook = hookOf(strategy);
  if (!hook) return {};
  const int size = comm ? comm->size() : 1;
  const int rank = comm ? comm->rank() : 0;
  parallel::NamedTensors mine = hook->stateDict();
  if (rank != 0) {
    sendPacked(*comm, pack(mine), 0);
    return {};
  }
  parallel::NamedTensors out;
  for (int r = 0; r < size; ++r) {
    parallel::NamedTensors part =
        r == 0 ? std::move(mine) : unpack(recvPacked(*comm, r), "rank " + std::to_string(r));
    for (auto& [name, t] : part)
      out.emplace_back(kPrefix + std::to_string(r) + "." + name, std::move(t));
  }
  return out;
}

void scatterCompressionState(comm::Communicator* comm, parallel::Strategy& strategy,
                             const parallel::NamedTensors& saved) {
  parallel::CommHook* hook = hookOf(strategy);
  const int size = comm ? comm->size() : 1;
  const int rank = comm ? comm->rank() : 0;
  // Rank 0 decides, and every rank learns the verdict before any state moves, so that
  // all of them throw together rather than wait for messages that never come.
  int64_t verdict = 0;  // 0: nothing to load, 1: load, -1: the checkpoint has no state
                        // for rank `size - 1` (written by fewer ranks), -2: more ranks,
                        // -3: state but no hook
  std::vector<parallel::NamedTensors> parts(static_cast<size_t>(size));
  if (rank == 0) {
    int maxRank = -1;
    for (const auto& [name, t] : saved) {
      KOLO_REQUIRE(name.rfind(kPrefix, 0) == 0, "checkpoint: unexpected extra tensor '", name, "'");
      const size_t dot = name.find('.', std::strlen(kPrefix));
      const int r = std::stoi(name.substr(std::strlen(kPrefix), dot - std::strlen(kPrefix)));
      maxRank = std::max(maxRank, r);
      if (r < size) parts[static_cast<size_t>(r)].emplace_back(name.substr(dot + 1), t);
    }
    if (maxRank >= 0 && !hook)
      verdict = -3;
    else if (maxRank >= size)
      verdict = -2;
    else if (maxRank >= 0 && maxRank < size - 1)
      verdict = -1;
    else
      verdict = maxRank >= 0 ? 1 : 0;
  }
  if (comm && size > 1) comm->broadcast(&verdict, 1, DType::I64, 0);
  if (verdict == -3)
    KOLO_THROW(Mismatch,
               "resuming: the checkpoint holds communication-hook state (it was written with a "
               "DataParallelOptions::commHook) but this run's commHook is none");
  if (verdict == -2 || verdict == -1)
    KOLO_THROW(Mismatch, "resuming: the checkpoint's DataParallelOptions::commHook state was written by ",
               verdict == -2 ? "more" : "fewer", " ranks than this run's ", size,
               "; compression residuals are per rank, resume with the same rank count");
  if (verdict == 0) return;
  if (rank == 0) {
    for (int r = 1; r < size; ++r) sendPacked(*comm, pack(parts[static_cast<size_t>(r)]), r);
    hook->loadStateDict(parts[0]);
  } else {
    hook->loadStateDict(unpack(recvPacked(*comm, 0), "rank 0"));
  }
}

}  // namespace kolo::train::detail
