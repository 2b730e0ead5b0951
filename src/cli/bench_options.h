// Settings of `kolo bench COLLECTIVE` and the pieces that do not need a communicator:
// byte sizes with K/M/G suffixes, the size sweep, and the collectives' names and
// bus-bandwidth factors (nccl-tests' conventions).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::cli {

enum class BenchCollective { Allreduce, Reduce, Broadcast, Allgather, ReduceScatter, Alltoall, Gather, Scatter };

/// Everything one rank needs to run the sweep.
struct BenchConfig {
  BenchCollective collective = BenchCollective::Allreduce;
  std::vector<size_t> sizes;  // bytes, in sweep order
  int iters = 20;
  int warmup = 5;
  /// Per-size warm-up/iterations of the peer benchmarks in bench/peers (20/200 up to 64 KiB,
  /// 10/100 up to 1 MiB, 3/30 up to 16 MiB, else 2/20) instead of iters/warmup.
  bool anchorSchedule = false;
  comm::Algorithm algorithm = comm::Algorithm::Auto;
  DType dtype = DType::F32;
  comm::ReduceOp op = comm::ReduceOp::Sum;
  int root = 0;
  bool inPlace = true;
  bool json = false;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// Parses "4096", "4K", "1M", "2G" (binary multiples; a trailing "B" or "iB" is allowed).
/// Throws InvalidArgument naming the text otherwise.
size_t parseByteSize(const std::string& text);

/// Sizes from `minBytes` to `maxBytes`: multiplied by `factor` each step when `stepBytes`
/// is 0, else increased by `stepBytes`. Throws InvalidArgument for an empty or endless sweep.
std::vector<size_t> sizeSweep(size_t minBytes, size_t maxBytes, double factor, size_t stepBytes);

/// Parses a comma-separated list of sizes ("4K,1M,16M").
std::vector<size_t> parseSizeList(const std::string& text);

/// "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "gather", "scatter".
const char* benchCollectiveName(BenchCollective collective);
/// Parses a name as printed by benchCollectiveName (also "reduce_scatter", "bcast"...).
BenchCollective parseBenchCollective(const std::string& name);

/// busbw / algbw for `ranks` ranks: allreduce 2(n-1)/n; reducescatter, allgather, alltoall,
/// gather, scatter (n-1)/n; broadcast and reduce 1.
double busBandwidthFactor(BenchCollective collective, int ranks);

/// Whether each rank's share of the message is bytes / ranks (allgather, reducescatter,
/// alltoall, gather, scatter) rather than the whole message.
bool splitsAcrossRanks(BenchCollective collective);

}  // namespace kolo::cli
