// The sweep of `kolo bench`: per size a checked operation, warm-up, timed operations
// (barrier; t0; op; t1; the per-operation time is the maximum over ranks, reduced outside
// the timed region, as the peer benchmarks in bench/peers do), a second checked operation,
// and rank 0's row.
#include "cli/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/bench_case.h"

namespace kolo::cli {
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

// Whether every rank's check passed (a collective: every rank calls it).
bool agree(comm::Communicator& comm, bool ok, const comm::CollectiveOptions& options) {
  int32_t flag = ok ? 1 : 0;
  comm.allreduce(&flag, &flag, 1, DType::I32, comm::ReduceOp::Min, options);
  return flag == 1;
}

BenchRow measure(comm::Communicator& comm, const BenchConfig& config, size_t requested) {
  comm::CollectiveOptions options;
  options.algorithm = config.algorithm;
  options.timeout = config.timeout;
  BenchCase bench(comm, config, requested);
  BenchRow row;
  row.bytes = bench.bytes();
  row.count = bench.count();
  row.warmup = config.warmup;
  row.iters = config.iters;
  if (config.anchorSchedule) anchorSchedule(row.bytes, row.warmup, row.iters);

  bench.fillForCheck();
  bench.run(options);
  bool correct = bench.verify();

  bench.fillZeros();
  for (int i = 0; i < row.warmup; ++i) bench.run(options);
  std::vector<double> times;
  times.reserve(static_cast<size_t>(row.iters));
  for (int i = 0; i < row.iters; ++i) {
    comm.barrier(options);
    const auto start = Clock::now();
    bench.run(options);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    comm.allreduce(&seconds, &seconds, 1, DType::F64, comm::ReduceOp::Max, options);
    times.push_back(seconds);
  }

  // A second check after the timed operations catches state that goes bad over time.
  bench.fillForCheck();
  bench.run(options);
  correct = correct && bench.verify();
  row.correct = agree(comm, correct, options);

  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    const double mid = median(times);
    row.medianUs = mid * 1e6;
    row.minUs = times.front() * 1e6;
    row.p10Us = percentile(times, 0.1) * 1e6;
    row.p90Us = percentile(times, 0.9) * 1e6;
    row.maxUs = times.back() * 1e6;
    row.algbw = mid > 0 ? static_cast<double>(row.bytes) / mid / 1e9 : 0;
    row.busbw = row.algbw * busBandwidthFactor(config.collective, comm.size());
  }
  return row;
}

double rounded(double value, double scale) { return std::round(value * scale) / scale; }

void printHeader(std::FILE* out, const comm::Communicator& comm, const BenchConfig& config,
                 const std::string& backendLabel) {
  std::fprintf(out, "# kolo bench %s: np %d, backend %s, algo %s, dtype %s, op %s, root %d, %s, ",
               benchCollectiveName(config.collective), comm.size(), backendLabel.c_str(),
               comm::algorithmName(config.algorithm), dtypeName(config.dtype), comm::reduceOpName(config.op),
               config.root, config.inPlace ? "in place" : "out of place");
  if (config.anchorSchedule) {
    std::fprintf(out, "anchor schedule\n");
  } else {
    std::fprintf(out, "warmup %d, iters %d\n", config.warmup, config.iters);
  }
  std::fprintf(out, "# time: median over iterations of the slowest rank; GB = 1e9 bytes\n");
  std::fprintf(out, "%14s %12s %12s %12s %12s %8s\n", "bytes", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
               "correct");
}

void printRow(std::FILE* out, const comm::Communicator& comm, const BenchConfig& config,
              const std::string& backendLabel, const BenchRow& row) {
  if (!config.json) {
    std::fprintf(out, "%14zu %12zu %12.2f %12.4f %12.4f %8s\n", row.bytes, row.count, row.medianUs, row.algbw,
                 row.busbw, row.correct ? "yes" : "NO");
    std::fflush(out);
    return;
  }
  nlohmann::ordered_json line;
  line["bench"] = std::string("kolo_") + benchCollectiveName(config.collective);
  line["impl"] = "kolo-" + backendLabel;
  line["collective"] = benchCollectiveName(config.collective);
  line["backend"] = backendLabel;
  line["algo"] = comm::algorithmName(config.algorithm);
  line["np"] = comm.size();
  line["dtype"] = dtypeName(config.dtype);
  line["op"] = comm::reduceOpName(config.op);
  line["root"] = config.root;
  line["inplace"] = config.inPlace;
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
  line["correct"] = row.correct;
  std::fprintf(out, "%s\n", line.dump().c_str());
  std::fflush(out);
}

}  // namespace

bool runBenchmark(comm::Communicator& comm, const BenchConfig& config, const std::string& backendLabel,
                  std::FILE* out) {
  const bool printer = comm.rank() == 0;
  if (printer && !config.json) printHeader(out, comm, config, backendLabel);
  bool allCorrect = true;
  for (size_t bytes : config.sizes) {
    const BenchRow row = measure(comm, config, bytes);
    allCorrect = allCorrect && row.correct;
    if (printer) printRow(out, comm, config, backendLabel, row);
  }
  return allCorrect;
}

}  // namespace kolo::cli
