// The rows of `kolo bench` on one rank: comm::benchmarkCollective for each size of the
// sweep; rank 0 prints the header and one table row (or JSON line) per size.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "kolo/comm/benchmark.h"

namespace kolo::cli {

/// Everything one rank needs to run the sweep.
struct BenchConfig {
  comm::BenchmarkOptions options;
  std::vector<size_t> sizes;  // bytes, in sweep order
  bool json = false;
};

/// Runs the sweep on `comm` (collective: every rank calls it with the same config). Rank 0
/// writes the table (or JSON lines) to `out`. Returns whether every check passed on every rank.
bool runBenchmark(comm::Communicator& comm, const BenchConfig& config, const std::string& backendLabel,
                  std::FILE* out);

}  // namespace kolo::cli
