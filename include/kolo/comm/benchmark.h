// Measuring a collective from inside a job, as nccl-tests does: a checked operation with
// closed-form expected values, warm-up, timed operations (the slowest rank's time each),
// a second check, and algbw/busbw. A program calls it on the communicator it already has
// (a preflight of the fabric under Slurm, say); `kolo bench` prints its rows.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm {

/// The collectives benchmarkCollective measures.
enum class Collective : uint8_t { Allreduce, Reduce, Broadcast, Allgather, ReduceScatter, Alltoall, Gather, Scatter };

/// "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "gather", "scatter".
const char* collectiveName(Collective collective);
/// Parses a name as collectiveName prints it (also "all_reduce", "reduce_scatter", "bcast", ...).
/// Throws InvalidArgument naming the text and the names accepted.
Collective parseCollective(const std::string& name);

/// busbw / algbw over `ranks` ranks (nccl-tests' factors): allreduce 2(n-1)/n; reducescatter,
/// allgather, alltoall, gather and scatter (n-1)/n; broadcast and reduce 1.
double busBandwidthFactor(Collective collective, int ranks);

/// Whether each rank's share of the message is bytes / ranks (allgather, reducescatter,
/// alltoall, gather, scatter) rather than the whole message (allreduce, reduce, broadcast).
bool splitsAcrossRanks(Collective collective);

/// Sizes from `minBytes` to `maxBytes`: multiplied by `factor` each step when `stepBytes`
/// is 0, else increased by `stepBytes`. Throws InvalidArgument for an empty or endless sweep.
std::vector<size_t> sizeSweep(size_t minBytes, size_t maxBytes, double factor, size_t stepBytes);

/// Parses a comma-separated list of byte sizes ("4K,1M,16M"; see parseByteSize). Throws
/// InvalidArgument when a size is malformed or the list names none.
std::vector<size_t> parseSizeList(const std::string& text);

/// What to measure; every rank passes the same options.
struct BenchmarkOptions {
  Collective collective = Collective::Allreduce;
  DType dtype = DType::F32;
  /// The reduction of allreduce, reduce and reducescatter.
  ReduceOp op = ReduceOp::Sum;
  /// The root of reduce, broadcast, gather and scatter: 0 <= root < ranks.
  int root = 0;
  /// One buffer for input and output (the collectives' in-place forms), or two.
  bool inPlace = true;
  /// Forced algorithm, or Auto for the backend's choice by size and topology.
  Algorithm algorithm = Algorithm::Auto;
  /// Untimed operations before the timed ones (>= 0), and timed ones (>= 1).
  int warmup = 5;
  int iters = 20;
  /// Instead of warmup/iters, the per-size counts of the peer timers in bench/peers:
  /// 20/200 up to 64 KiB, 10/100 up to 1 MiB, 3/30 up to 16 MiB, else 2/20.
  bool anchorSchedule = false;
  /// Deadline of every operation, the timed ones included; zero: the communicator's own.
  std::chrono::milliseconds timeout{0};
};

/// One size's figures, the same on every rank.
struct BenchmarkResult {
  /// Bytes the operation moves in nccl-tests' sense (the whole message), after rounding
  /// the requested size down to whole elements (per rank, for the split collectives).
  size_t bytes = 0;
  /// Elements per call argument: the whole message for allreduce, reduce and broadcast,
  /// each rank's block for the others.
  size_t count = 0;
  /// The warm-up and timed operations run (from the options or the anchor schedule).
  int warmup = 0;
  int iters = 0;
  /// Per-operation time of the slowest rank over the timed operations, microseconds:
  /// median, minimum, nearest-rank 10th and 90th percentiles, maximum.
  double medianUs = 0, minUs = 0, p10Us = 0, p90Us = 0, maxUs = 0;
  /// bytes / median time and algbw × busBandwidthFactor, in GB/s (GB = 1e9 bytes).
  double algbw = 0;
  double busbw = 0;
  /// Whether both checked operations (before and after the timed ones) gave the
  /// closed-form result on every rank.
  bool correct = false;
  /// Per call, not medians: the timed operations that took more than 4 × the median, and
  /// the index of the last of them (-1 when none), so that a warm-up still under way (slow
  /// first calls, then fast ones) shows as slow calls that end early.
  int slowCalls = 0;
  int lastSlowCall = -1;
  /// Native backend: the waits of the timed operations that slept (futex or poll) rather
  /// than finding their data while spinning or yielding, summed over ranks; -1 elsewhere.
  int64_t waitsSlept = -1;
};

/// Measures `options.collective` at `bytes` over every rank of `comm`: one operation on
/// values with a closed-form result (comm/closed_form.h) checked on every rank, zeroed
/// buffers, the warm-up, the timed operations (each `barrier; t0; op; t1`, the time being
/// the maximum over ranks, reduced outside the timed region), then a second checked
/// operation; whether the checks passed is agreed over the ranks. A collective: every rank
/// calls it with the same options and bytes, and it blocks until the measurement ends.
/// Allocates the buffers it needs for this call and frees them on return. A wrong result
/// is reported through `correct`, not thrown. Throws InvalidArgument (on every rank,
/// before any communication) naming the setting for a root outside the ranks, negative
/// warm-up or fewer than one timed operation, or a non-zero size below one element (one
/// element per rank for the split collectives); a rank that fails or misses the deadline
/// surfaces as the communicator's errors.
BenchmarkResult benchmarkCollective(Communicator& comm, const BenchmarkOptions& options, size_t bytes);

/// The table of `kolo bench`, as nccl-tests prints it: a header naming the measurement
/// (`options` over `ranks` ranks of `backend`) and the columns, then one row per result:
/// bytes, count, median time (us), algbw, busbw (GB/s) and whether the result was correct.
std::string benchmarkTableHeader(const BenchmarkOptions& options, int ranks, const std::string& backend);
std::string benchmarkTableRow(const BenchmarkResult& result);

/// One result as a JSON object on one line: bench, impl, collective, backend, algo, np,
/// dtype, op, root, inplace, bytes, count, warmup, iters, t_median_us, t_min_us, t_p10_us,
/// t_p90_us, t_max_us, algbw_GBps, busbw_GBps, correct (the fields bench/*.sh read).
std::string benchmarkJson(const BenchmarkOptions& options, int ranks, const std::string& backend,
                          const BenchmarkResult& result);

/// `kolo bench`'s sweep: benchmarkCollective at each of `sizes` in turn; rank 0 writes to
/// `out` the table's header and a row per size, or with `json` benchmarkJson's line per size,
/// flushed after each line. Returns whether every result was correct (the same on every rank).
/// A collective, as benchmarkCollective, whose errors it throws.
bool benchmarkSweep(Communicator& comm, const BenchmarkOptions& options, const std::vector<size_t>& sizes, bool json,
                    std::FILE* out);

}  // namespace kolo::comm
