// benchmarkCollective and its helpers: per size a checked operation, warm-up, timed
// operations (barrier; t0; op; t1; the per-operation time is the maximum over ranks,
// reduced outside the timed region, as the peer benchmarks in bench/peers do) and a second
// checked operation; the collectives' names, bus-bandwidth factors and size sweeps.
#include "kolo/comm/benchmark.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/printf_text.h"
#include "comm/benchmark_case.h"
#include "comm/native/native_communicator.h"
#include "kolo/byte_size.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace {

using Clock = std::chrono::steady_clock;

void anchorSchedule(size_t bytes, int& warmup, int& iters) {
  if (bytes <= (size_t{64} << 10)) { warmup = 20; iters = 200; }
  else if (bytes <= (size_t{1} << 20)) { warmup = 10; iters = 100; }
  else if (bytes <= (size_t{16} << 20)) { warmup = 3; iters = 30; }
  else { warmup = 2; iters = 20; }
}

// Nearest-rank percentile of sorted values, q in [0, 1].
double percentile(const std::vector<double>& sorted, double q) {
  const auto last = static_cast<long>(sorted.size()) - 1;
  const long index = std::clamp(static_cast<long>(q * static_cast<double>(last) + 0.5), 0L, last);
  return sorted[static_cast<size_t>(index)];
}

double median(const std::vector<double>& sorted) {
  const size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

bool rooted(Collective collective) {
  return collective == Collective::Reduce || collective == Collective::Broadcast ||
         collective == Collective::Gather || collective == Collective::Scatter;
}

// The settings every rank can refuse on its own, before any communication, so that a
// mistake ends the call on all ranks alike instead of leaving some waiting.
void checkOptions(const Communicator& comm, const BenchmarkOptions& options, size_t bytes) {
  const char* name = collectiveName(options.collective);
  if (rooted(options.collective)) {
    KOLO_REQUIRE(options.root >= 0 && options.root < comm.size(), "benchmark of ", name, ": root ", options.root,
                 " is not one of the ", comm.size(), " ranks (0 to ", comm.size() - 1, ")");
  }
  KOLO_REQUIRE(options.anchorSchedule || options.warmup >= 0, "benchmark of ", name,
               ": warm-up must be at least 0 operations, got ", options.warmup);
  KOLO_REQUIRE(options.anchorSchedule || options.iters >= 1, "benchmark of ", name,
               ": iterations must be at least 1, got ", options.iters);
  const size_t element = dtypeSize(options.dtype);
  const size_t least = splitsAcrossRanks(options.collective) ? element * static_cast<size_t>(comm.size()) : element;
  const std::string perRank =
      splitsAcrossRanks(options.collective) ? " per rank (" + std::to_string(least) + " bytes at " +
                                                  std::to_string(comm.size()) + " ranks)"
                                            : " (" + std::to_string(least) + " bytes)";
  KOLO_REQUIRE(bytes == 0 || bytes >= least, "benchmark of ", name, ": size ", bytes, " bytes is below one ",
               dtypeName(options.dtype), " element", perRank, "; use 0 for an empty message");
}

// Whether every rank's check passed (a collective: every rank calls it).
bool agree(Communicator& comm, bool ok, const CollectiveOptions& options) {
  int32_t flag = ok ? 1 : 0;
  comm.allreduce(&flag, &flag, 1, DType::I32, ReduceOp::Min, options);
  return flag == 1;
}

}  // namespace

const char* collectiveName(Collective collective) {
  switch (collective) {
    case Collective::Allreduce: return "allreduce";
    case Collective::Reduce: return "reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::Allgather: return "allgather";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::Alltoall: return "alltoall";
    case Collective::Gather: return "gather";
    case Collective::Scatter: return "scatter";
  }
  return "unknown";
}

Collective parseCollective(const std::string& name) {
  if (name == "allreduce" || name == "all_reduce") return Collective::Allreduce;
  if (name == "reduce") return Collective::Reduce;
  if (name == "broadcast" || name == "bcast") return Collective::Broadcast;
  if (name == "allgather" || name == "all_gather") return Collective::Allgather;
  if (name == "reducescatter" || name == "reduce_scatter" || name == "reduce-scatter") return Collective::ReduceScatter;
  if (name == "alltoall" || name == "all_to_all" || name == "all-to-all") return Collective::Alltoall;
  if (name == "gather") return Collective::Gather;
  if (name == "scatter") return Collective::Scatter;
  KOLO_THROW(InvalidArgument, "unknown collective '", name,
             "' (expected allreduce, reduce, broadcast, allgather, reducescatter, alltoall, gather or scatter)");
}

double busBandwidthFactor(Collective collective, int ranks) {
  const double n = ranks;
  switch (collective) {
    case Collective::Allreduce: return 2.0 * (n - 1) / n;
    case Collective::Reduce:
    case Collective::Broadcast: return 1.0;
    case Collective::Allgather:
    case Collective::ReduceScatter:
    case Collective::Alltoall:
    case Collective::Gather:
    case Collective::Scatter: return (n - 1) / n;
  }
  return 1.0;
}

bool splitsAcrossRanks(Collective collective) {
  return collective != Collective::Allreduce && collective != Collective::Reduce &&
         collective != Collective::Broadcast;
}

std::vector<size_t> sizeSweep(size_t minBytes, size_t maxBytes, double factor, size_t stepBytes) {
  if (minBytes > maxBytes) {
    KOLO_THROW(InvalidArgument, "size sweep: minimum ", minBytes, " bytes exceeds maximum ", maxBytes);
  }
  std::vector<size_t> sizes;
  if (stepBytes == 0 && (factor <= 1.0 || minBytes == 0)) {
    if (minBytes == maxBytes) return {minBytes};
    KOLO_THROW(InvalidArgument, "size sweep from ", minBytes, " to ", maxBytes, " needs a factor above 1 and a minimum ",
               "above 0, or a step above 0");
  }
  for (size_t size = minBytes; size <= maxBytes;) {
    sizes.push_back(size);
    const size_t next = stepBytes ? size + stepBytes : static_cast<size_t>(std::llround(size * factor));
    if (next <= size) break;  // overflow or a factor too small to move
    size = next;
  }
  return sizes;
}

std::vector<size_t> parseSizeList(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) sizes.push_back(parseByteSize(item));
  }
  if (sizes.empty()) KOLO_THROW(InvalidArgument, "size list '", text, "' names no size");
  return sizes;
}

BenchmarkResult benchmarkCollective(Communicator& comm, const BenchmarkOptions& options, size_t bytes) {
  checkOptions(comm, options, bytes);
  CollectiveOptions call;
  call.algorithm = options.algorithm;
  call.timeout = options.timeout;
  detail::BenchmarkCase bench(comm, options, bytes);
  BenchmarkResult result;
  result.bytes = bench.bytes();
  result.count = bench.count();
  result.warmup = options.warmup;
  result.iters = options.iters;
  if (options.anchorSchedule) anchorSchedule(result.bytes, result.warmup, result.iters);

  bench.fillForCheck();
  bench.run(call);
  bool correct = bench.verify();

  // Timed on zeros, so that repeated in-place reductions keep the values finite.
  bench.fillZeros();
  for (int i = 0; i < result.warmup; ++i) bench.run(call);
  std::vector<double> times;
  times.reserve(static_cast<size_t>(result.iters));
  auto* native = dynamic_cast<native::NativeCommunicator*>(&comm);
  const uint64_t sleptBefore = native ? native->waitCounts().slept : 0;
  for (int i = 0; i < result.iters; ++i) {
    comm.barrier(call);
    const auto start = Clock::now();
    bench.run(call);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    comm.allreduce(&seconds, &seconds, 1, DType::F64, ReduceOp::Max, call);
    times.push_back(seconds);
  }

  if (native) {
    // The loop's barriers and timing all-reduces are counted too: an upper bound.
    int64_t slept = static_cast<int64_t>(native->waitCounts().slept - sleptBefore);
    comm.allreduce(&slept, &slept, 1, DType::I64, ReduceOp::Sum, call);
    result.waitsSlept = slept;
  }
  if (!times.empty()) {
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double mid = median(sorted);
    for (size_t i = 0; i < times.size(); ++i) {
      if (times[i] <= 4 * mid) continue;
      ++result.slowCalls;
      result.lastSlowCall = static_cast<int>(i);
    }
  }

  // A second check after the timed operations catches state that goes bad over time.
  bench.fillForCheck();
  bench.run(call);
  correct = correct && bench.verify();
  result.correct = agree(comm, correct, call);

  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    const double mid = median(times);
    result.medianUs = mid * 1e6;
    result.minUs = times.front() * 1e6;
    result.p10Us = percentile(times, 0.1) * 1e6;
    result.p90Us = percentile(times, 0.9) * 1e6;
    result.maxUs = times.back() * 1e6;
    result.algbw = mid > 0 ? static_cast<double>(result.bytes) / mid / 1e9 : 0;
    result.busbw = result.algbw * busBandwidthFactor(options.collective, comm.size());
  }
  return result;
}

namespace {

double rounded(double value, double scale) { return std::round(value * scale) / scale; }

}  // namespace

std::string benchmarkTableHeader(const BenchmarkOptions& o, int ranks, const std::string& backend) {
  std::string text = kolo::detail::printfText(
      "# kolo bench %s: np %d, backend %s, algo %s, dtype %s, op %s, root %d, %s, ",
      collectiveName(o.collective), ranks, backend.c_str(), algorithmName(o.algorithm),
      dtypeName(o.dtype), reduceOpName(o.op), o.root, o.inPlace ? "in place" : "out of place");
  text += o.anchorSchedule ? std::string("anchor schedule\n")
                           : kolo::detail::printfText("warmup %d, iters %d\n", o.warmup, o.iters);
  text += "# time: median over iterations of the slowest rank; GB = 1e9 bytes\n";
  return text + kolo::detail::printfText("%14s %12s %12s %12s %12s %8s", "bytes", "count",
                                         "time(us)", "algbw(GB/s)", "busbw(GB/s)", "correct");
}

std::string benchmarkTableRow(const BenchmarkResult& row) {
  return kolo::detail::printfText("%14zu %12zu %12.2f %12.4f %12.4f %8s", row.bytes, row.count,
                                  row.medianUs, row.algbw, row.busbw, row.correct ? "yes" : "NO");
}

std::string benchmarkJson(const BenchmarkOptions& o, int ranks, const std::string& backend,
                          const BenchmarkResult& row) {
  nlohmann::ordered_json line;
  line["bench"] = std::string("kolo_") + collectiveName(o.collective);
  line["impl"] = "kolo-" + backend;
  line["collective"] = collectiveName(o.collective);
  line["backend"] = backend;
  line["algo"] = algorithmName(o.algorithm);
  line["np"] = ranks;
  line["dtype"] = dtypeName(o.dtype);
  line["op"] = reduceOpName(o.op);
  line["root"] = o.root;
  line["inplace"] = o.inPlace;
  line["bytes"] = row.bytes;
  line["count"] = row.count;
  line["warmup"] = row.warmup;
  line["iters"] = row.iters;
  line["t_median_us"] = rounded(row.medianUs, 1e3);
  line["t_min_us"] = rounded(row.minUs, 1e3);
  line["t_p10_us"] = rounded(row.p10Us, 1e3);
  line["t_p90_us"] = rounded(row.p90Us, 1e3);
  line["t_max_us"] = rounded(row.maxUs, 1e3);
  line["algbw_GBps"] = rounded(row.algbw, 1e4);
  line["busbw_GBps"] = rounded(row.busbw, 1e4);
  line["slow_calls"] = row.slowCalls;
  line["last_slow_call"] = row.lastSlowCall;
  if (row.waitsSlept >= 0) line["waits_slept"] = row.waitsSlept;
  line["correct"] = row.correct;
  return line.dump();
}

bool benchmarkSweep(Communicator& comm, const BenchmarkOptions& options, const std::vector<size_t>& sizes, bool json,
                    std::FILE* out) {
  const std::string backend = comm.backendName();
  const bool writes = comm.rank() == 0;
  if (writes && !json) std::fprintf(out, "%s\n", benchmarkTableHeader(options, comm.size(), backend).c_str());
  bool allCorrect = true;
  for (const size_t bytes : sizes) {
    const BenchmarkResult row = benchmarkCollective(comm, options, bytes);
    allCorrect = allCorrect && row.correct;
    if (!writes) continue;
    const std::string line = json ? benchmarkJson(options, comm.size(), backend, row) : benchmarkTableRow(row);
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
  }
  return allCorrect;
}

}  // namespace kolo::comm
