// `kolo bench COLLECTIVE`: a collectives benchmark in the manner of nccl-tests (size
// sweep, warm-up and timed iterations, algbw/busbw, a correctness check per size), run on
// ranks it forks itself (--ranks), on a shared store directory, or under kolo run / mpirun.
#include <memory>
#include <string>
#include <CLI/CLI.hpp>

#include "cli/bench_launch.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "kolo/byte_size.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

struct BenchArgs {
  std::string collective;
  std::string minBytes = "4K";
  std::string maxBytes = "64M";
  double factor = 2;
  std::string stepBytes = "0";
  std::string sizes;
  int iters = 20;
  int warmup = 5;
  bool anchorSchedule = false;
  std::string algo = "auto";
  std::string dtype = "f32";
  std::string op = "sum";
  int root = 0;
  bool outOfPlace = false;
  bool json = false;
  double timeoutSeconds = 60;
  BenchLaunch launch;
};

BenchConfig toConfig(const BenchArgs& args) {
  KOLO_REQUIRE(args.iters >= 1, "kolo bench: -n/--iters must be at least 1, got ", args.iters);
  KOLO_REQUIRE(args.warmup >= 0, "kolo bench: -w/--warmup must be at least 0, got ", args.warmup);
  KOLO_REQUIRE(args.timeoutSeconds > 0, "kolo bench: --timeout must be above 0, got ", args.timeoutSeconds);
  BenchConfig config;
  comm::BenchmarkOptions& o = config.options;
  o.collective = comm::parseCollective(args.collective);
  o.dtype = parseDType(args.dtype);
  o.op = comm::parseReduceOp(args.op);
  o.root = args.root;
  o.inPlace = !args.outOfPlace;
  o.algorithm = comm::parseAlgorithm(args.algo);
  o.warmup = args.warmup;
  o.iters = args.iters;
  o.anchorSchedule = args.anchorSchedule;
  o.timeout = std::chrono::milliseconds(static_cast<long long>(args.timeoutSeconds * 1000));
  config.sizes = args.sizes.empty() ? comm::sizeSweep(parseByteSize(args.minBytes), parseByteSize(args.maxBytes),
                                                      args.factor, parseByteSize(args.stepBytes))
                                    : comm::parseSizeList(args.sizes);
  config.json = args.json;
  return config;
}

}  // namespace

Command registerBench(CLI::App& root) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* app = root.add_subcommand("bench", "Benchmark a collective over a size sweep (as nccl-tests)");
  app->footer(
      "Examples:\n"
      "  kolo bench allreduce --ranks 4 -b 4K -e 64M -f 2\n"
      "  kolo bench allreduce --ranks 2 --sizes 4K,1M,16M,64M --json\n"
      "  mpirun -np 2 kolo bench allreduce --backend mpi\n"
      "Rank 0 prints one row per size: bytes, count, time (median over iterations of the slowest\n"
      "rank, us), algbw = bytes/time and busbw (GB/s, 1e9 bytes), and whether every result was\n"
      "correct. The exit code is 3 when a result was wrong, 1 when a rank failed.");
  app->add_option("collective", args->collective,
                  "allreduce, reduce, broadcast, allgather, reducescatter, alltoall, gather or scatter")
      ->required();
  app->add_option("-b,--minbytes", args->minBytes, "smallest size (bytes; K/M/G suffixes)")->capture_default_str();
  app->add_option("-e,--maxbytes", args->maxBytes, "largest size")->capture_default_str();
  app->add_option("-f,--stepfactor", args->factor, "multiply the size by this each step")->capture_default_str();
  app->add_option("-i,--stepbytes", args->stepBytes, "add this many bytes each step instead of -f");
  app->add_option("--sizes", args->sizes, "comma-separated sizes instead of a sweep, e.g. 4K,1M,16M");
  app->add_option("-n,--iters", args->iters, "timed iterations per size")->capture_default_str();
  app->add_option("-w,--warmup", args->warmup, "warm-up iterations per size")->capture_default_str();
  app->add_flag("--anchor-schedule", args->anchorSchedule,
                "per-size warm-up/iterations of the peer timers in bench/peers (20/200 at small "
                "sizes down to 2/20 above 16 MiB) instead of -w/-n");
  app->add_option("--algo", args->algo, "auto, ring, halving-doubling, tree, reduce-broadcast, hierarchical")
      ->capture_default_str();
  app->add_option("-d,--dtype", args->dtype, "f32, f64, f16, bf16, i32, i64, u8")->capture_default_str();
  app->add_option("-o,--op", args->op, "sum, prod, min, max, avg")->capture_default_str();
  app->add_option("-r,--root", args->root, "root rank of reduce, broadcast, gather, scatter")->capture_default_str();
  app->add_flag("--out-of-place", args->outOfPlace, "separate send and receive buffers (default: in place)");
  app->add_flag("--json", args->json, "one JSON object per size instead of the table");
  app->add_option("--timeout", args->timeoutSeconds, "deadline of every collective, seconds")->capture_default_str();
  app->add_option("--backend", args->launch.backend, "auto, native or mpi")
      ->check(oneOf({"auto", "native", "mpi"}))
      ->capture_default_str();
  app->add_option("--ranks", args->launch.ranks, "fork this many local ranks (native backend)");
  app->add_option("--store-dir", args->launch.storeDir,
                  "join a job through a file store in this shared directory (with --rank, --world-size)");
  app->add_option("--rank", args->launch.rank, "this process's rank (with --store-dir)");
  app->add_option("--world-size", args->launch.worldSize, "number of ranks (with --store-dir)");
  app->add_option("--listen", args->launch.listenAddress, "address the native backend listens on for TCP peers");
  app->add_option("--host-id", args->launch.hostId, "host identity (ranks with equal ids use shared memory)");
  app->add_option("--bind", args->launch.bind,
                  "with --ranks: core binds rank i to the i-th CPU (modulo their count) this process may "
                  "use, as mpirun does; none leaves placement to the scheduler")
      ->check(oneOf({"none", "core"}))
      ->capture_default_str();
  app->add_flag("!--no-shm", args->launch.sharedMemory, "TCP between all ranks, no shared memory");

  Command command;
  command.app = app;
  command.run = [args]() -> int { return launchBenchmark(toConfig(*args), args->launch); };
  return command;
}

}  // namespace kolo::cli
