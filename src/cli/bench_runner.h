// The benchmark loop of `kolo bench` on one rank: for each size, a checked operation with
// closed-form expected values, warm-up, then timed operations (barrier; t0; op; t1, the
// time being the maximum over ranks) and a second check; rank 0 prints the rows.
#pragma once

#include <cstdio>
#include <string>

#include "cli/bench_options.h"
#include "kolo/comm/communicator.h"

namespace kolo::cli {

/// One size's figures, as printed.
struct BenchRow {
  size_t bytes = 0;
  size_t count = 0;  // elements per rank's share (the whole message for allreduce/reduce/broadcast)
  int warmup = 0;
  int iters = 0;
  double medianUs = 0, minUs = 0, p10Us = 0, p90Us = 0, maxUs = 0;
  double algbw = 0;  // GB/s, GB = 1e9 bytes
  double busbw = 0;
  bool correct = false;
};

/// Runs the sweep on `comm` (collective: every rank calls it with the same config). Rank 0
/// writes the table (or JSON lines) to `out`. Returns whether every check passed on every rank.
bool runBenchmark(comm::Communicator& comm, const BenchConfig& config, const std::string& backendLabel,
                  std::FILE* out);

}  // namespace kolo::cli
