// `kolo bench COLLECTIVE`: comm::benchmarkCollective over a size sweep, as nccl-tests
// measures, on local ranks started with comm::spawn (--ranks), on a shared store directory,
// or as a rank of an enclosing kolo run / mpirun. Rank 0 prints a table row or a JSON line
// (the fields bench/*.sh and the tests read) per size. Exit codes: 0 every result correct,
// 3 a wrong result, 1 a rank failed.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "kolo/byte_size.h"
#include "kolo/comm/benchmark.h"
#include "kolo/comm/init.h"
#include "kolo/comm/spawn.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "launch/rendezvous_benchmark.h"

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
  std::string backend = "auto";  // auto, native or mpi
  int ranks = 0;                 // > 0: start this many local ranks
  std::string bind = "core";
  std::string storeDir;  // non-empty: join as rank `rank` of `worldSize` through this directory
  int rank = -1;
  int worldSize = 0;
  comm::NativeOptions native;
  int hosts = 0;       // rendezvous: simulated hosts
  double drop = 0;     // rendezvous: percent of ranks lost
  bool hostStores = true;  // rendezvous: a host store per simulated host
  bool fullAddressBook = false;  // rendezvous: every rank reads every record too
};

/// Everything one rank needs to run the sweep.
struct BenchConfig {
  comm::BenchmarkOptions options;
  std::vector<size_t> sizes;  // bytes, in sweep order
  bool json = false;
};

constexpr int kExitWrong = 3;
constexpr int kExitFailed = 1;

BenchConfig toConfig(const BenchArgs& args) {
  KOLO_REQUIRE(args.iters >= 1, "kolo bench: -n/--iters must be at least 1, got ", args.iters);
  KOLO_REQUIRE(args.warmup >= 0, "kolo bench: -w/--warmup must be at least 0, got ", args.warmup);
  KOLO_REQUIRE(args.timeoutSeconds > 0, "kolo bench: --timeout must be above 0, got ", args.timeoutSeconds);
  KOLO_REQUIRE(args.ranks >= 0, "kolo bench: --ranks must be at least 1, got ", args.ranks);
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

// One rank's sweep (rank 0 prints): 0 when every result was correct, else kExitWrong.
int runRank(comm::Communicator& comm, const BenchConfig& config) {
  const bool allCorrect = comm::benchmarkSweep(comm, config.options, config.sizes, config.json, stdout);
  if (!allCorrect && comm.rank() == 0) std::fprintf(stderr, "kolo bench: some results were wrong\n");
  return allCorrect ? 0 : kExitWrong;
}

// This process's communicator in a job started elsewhere: --store-dir, else the environment
// (kolo run, mpirun, srun, torchrun).
std::shared_ptr<comm::Communicator> joinJob(const BenchArgs& args, const comm::NativeOptions& native) {
  if (!args.storeDir.empty()) {
    return comm::createNativeCommunicator(comm::makeFileStore(args.storeDir), args.rank, args.worldSize, native);
  }
  comm::InitOptions init;
  init.backend = args.backend;
  init.timeout = native.timeout;
  return comm::initFromEnvironment(init);
}

int launchBenchmark(const BenchArgs& args, const BenchConfig& config) {
  comm::NativeOptions native = args.native;
  native.timeout = config.options.timeout;
  native.storePrefix = "kolo-bench";
  if (args.ranks > 0) {
    KOLO_REQUIRE(args.backend != "mpi", "kolo bench: --ranks starts native ranks; for MPI run `mpirun -np ",
                 args.ranks, " kolo bench ... --backend mpi`");
    try {
      const std::vector<int> codes = comm::spawn(args.ranks, [&](auto comm) { return runRank(*comm, config); },
                                                 {native, comm::parseCpuBinding(args.bind)});
      return *std::max_element(codes.begin(), codes.end());
    } catch (const PeerError& e) {
      std::fprintf(stderr, "kolo bench: %s\n", e.what());
      return kExitFailed;
    }
  }
  KOLO_REQUIRE(args.storeDir.empty() || (args.rank >= 0 && args.rank < args.worldSize),
               "kolo bench: --store-dir needs --rank R and --world-size N with 0 <= R < N (got ", args.rank, " and ",
               args.worldSize, ")");
  try {
    auto comm = joinJob(args, native);
    comm->setTimeout(native.timeout);
    return runRank(*comm, config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo bench: rank %d: %s\n", args.storeDir.empty() ? -1 : args.rank, e.what());
    return kExitFailed;
  }
}

// `kolo bench rendezvous`: the control plane alone, --ranks simulated ranks in this process's
// children (launch::benchmarkRendezvous).
int benchRendezvous(const BenchArgs& args) {
  KOLO_REQUIRE(args.ranks >= 2, "kolo bench rendezvous: --ranks must be at least 2, got ", args.ranks);
  KOLO_REQUIRE(args.timeoutSeconds > 0, "kolo bench: --timeout must be above 0, got ", args.timeoutSeconds);
  launch::RendezvousBenchmarkOptions options;
  options.ranks = args.ranks;
  options.hosts = args.hosts;
  options.dropPercent = args.drop;
  options.hostStores = args.hostStores;
  options.fullAddressBook = args.fullAddressBook;
  options.timeout = std::chrono::milliseconds(static_cast<long long>(args.timeoutSeconds * 1000));
  const launch::RendezvousBenchmarkResult result = launch::benchmarkRendezvous(options);
  const std::string text =
      args.json ? launch::rendezvousBenchmarkJson(result) + "\n" : launch::rendezvousBenchmarkTable(result);
  std::fputs(text.c_str(), stdout);
  return 0;
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
      "  kolo bench rendezvous --ranks 4096 --drop 1 --json\n"
      "Rank 0 prints one row per size: bytes, count, time (median over iterations of the slowest\n"
      "rank, us), algbw = bytes/time and busbw (GB/s, 1e9 bytes), and whether every result was\n"
      "correct. The exit code is 3 when a result was wrong, 1 when a rank failed.");
  app->add_option("collective", args->collective,
                  "allreduce, reduce, broadcast, allgather, reducescatter, alltoall, gather or scatter; "
                  "rendezvous measures the control plane with --ranks simulated ranks")
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
  app->add_option("--backend", args->backend, "auto, native or mpi")
      ->check(oneOf({"auto", "native", "mpi"}))
      ->capture_default_str();
  app->add_option("--ranks", args->ranks, "fork this many local ranks (native backend)");
  app->add_option("--store-dir", args->storeDir,
                  "join a job through a file store in this shared directory (with --rank, --world-size)");
  app->add_option("--rank", args->rank, "this process's rank (with --store-dir)");
  app->add_option("--world-size", args->worldSize, "number of ranks (with --store-dir)");
  app->add_option("--listen", args->native.listenAddress, "address the native backend listens on for TCP peers");
  app->add_option("--host-id", args->native.hostId, "host identity (ranks with equal ids use shared memory)");
  app->add_option("--bind", args->bind,
                  "with --ranks: core binds rank i to the i-th CPU (modulo their count) this process may "
                  "use, as mpirun does; none leaves placement to the scheduler")
      ->check(oneOf({"none", "core"}))
      ->capture_default_str();
  app->add_flag("!--no-shm", args->native.sharedMemory, "TCP between all ranks, no shared memory");
  app->add_option("--hosts", args->hosts,
                  "rendezvous: simulated hosts the ranks are split into (default: one per 8 ranks)");
  app->add_option("--drop", args->drop,
                  "rendezvous: percent of the ranks lost after the first barrier; the survivors regroup");
  app->add_flag("!--no-host-stores", args->hostStores,
                "rendezvous: every rank connects to the root store (default: each simulated "
                "host's ranks connect to a host store that forwards to the root in batches)");
  app->add_flag("--full-address-book", args->fullAddressBook,
                "rendezvous: every rank also reads every rank's record, as a communicator that "
                "connects to every peer at once must (the baseline)");

  Command command;
  command.app = app;
  command.run = [args]() -> int {
    if (args->collective == "rendezvous") return benchRendezvous(*args);
    return launchBenchmark(*args, toConfig(*args));
  };
  return command;
}

}  // namespace kolo::cli
