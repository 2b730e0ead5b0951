// The printing of `kolo bench`: the header and one row per size, as a table or as JSON
// lines (the fields bench/*.sh and the tests read); the measuring is comm::benchmarkCollective.
#include "cli/bench_runner.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace kolo::cli {
namespace {

double rounded(double value, double scale) { return std::round(value * scale) / scale; }

void printHeader(std::FILE* out, const comm::Communicator& comm, const comm::BenchmarkOptions& o,
                 const std::string& backendLabel) {
  std::fprintf(out, "# kolo bench %s: np %d, backend %s, algo %s, dtype %s, op %s, root %d, %s, ",
               comm::collectiveName(o.collective), comm.size(), backendLabel.c_str(), comm::algorithmName(o.algorithm),
               dtypeName(o.dtype), comm::reduceOpName(o.op), o.root, o.inPlace ? "in place" : "out of place");
  if (o.anchorSchedule) {
    std::fprintf(out, "anchor schedule\n");
  } else {
    std::fprintf(out, "warmup %d, iters %d\n", o.warmup, o.iters);
  }
  std::fprintf(out, "# time: median over iterations of the slowest rank; GB = 1e9 bytes\n");
  std::fprintf(out, "%14s %12s %12s %12s %12s %8s\n", "bytes", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
               "correct");
}

void printRow(std::FILE* out, const comm::Communicator& comm, const BenchConfig& config,
              const std::string& backendLabel, const comm::BenchmarkResult& row) {
  if (!config.json) {
    std::fprintf(out, "%14zu %12zu %12.2f %12.4f %12.4f %8s\n", row.bytes, row.count, row.medianUs, row.algbw,
                 row.busbw, row.correct ? "yes" : "NO");
    std::fflush(out);
    return;
  }
  const comm::BenchmarkOptions& o = config.options;
  nlohmann::ordered_json line;
  line["bench"] = std::string("kolo_") + comm::collectiveName(o.collective);
  line["impl"] = "kolo-" + backendLabel;
  line["collective"] = comm::collectiveName(o.collective);
  line["backend"] = backendLabel;
  line["algo"] = comm::algorithmName(o.algorithm);
  line["np"] = comm.size();
  line["dtype"] = dtypeName(o.dtype);
  line["op"] = comm::reduceOpName(o.op);
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
  line["correct"] = row.correct;
  std::fprintf(out, "%s\n", line.dump().c_str());
  std::fflush(out);
}

}  // namespace

bool runBenchmark(comm::Communicator& comm, const BenchConfig& config, const std::string& backendLabel,
                  std::FILE* out) {
  const bool printer = comm.rank() == 0;
  if (printer && !config.json) printHeader(out, comm, config.options, backendLabel);
  bool allCorrect = true;
  for (size_t bytes : config.sizes) {
    const comm::BenchmarkResult row = comm::benchmarkCollective(comm, config.options, bytes);
    allCorrect = allCorrect && row.correct;
    if (printer) printRow(out, comm, config, backendLabel, row);
  }
  return allCorrect;
}

}  // namespace kolo::cli
