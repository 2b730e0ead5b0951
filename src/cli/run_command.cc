// `kolo run`: the launcher's command line. Parses the options and PROGRAM ARGS... (after
// `--` or the first non-option word) into parallel::LauncherOptions and runs the job (the
// launcher library takes the job token from KOLO_TOKEN). Started by srun with one task per
// node and no --nnodes, the nodes and the store come from Slurm (parallel::nodesFromSlurm).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "kolo/comm/spawn.h"
#include "kolo/error.h"
#include "launch/launcher.h"

namespace kolo::cli {

Command registerRun(CLI::App& root) {
  auto options = std::make_shared<parallel::LauncherOptions>();
  auto graceSeconds = std::make_shared<double>(5.0);
  auto bind = std::make_shared<std::string>("core");
  CLI::App* app =
      root.add_subcommand("run",
                          "start N ranks of PROGRAM on this node: kolo run -n N [--nnodes M "
                          "--node-rank R --store HOST:PORT] -- PROGRAM ARGS...");
  auto* nproc = app->add_option("-n,--nproc-per-node", options->procsPerNode, "ranks on this node")
                    ->check(atLeast(1));
  auto* servers = app->add_option("--ps", options->psServers,
                                  "parameter-server job: P server processes, the chief and "
                                  "--workers W workers (KOLO_ROLE ps|chief|worker)")
                      ->check(atLeast(1))
                      ->excludes(nproc);
  app->add_option("--workers", options->psWorkers, "workers of a parameter-server job (--ps)")
      ->check(atLeast(1))
      ->needs(servers);
  app->add_flag("--join", options->psJoin,
                "start one more worker for the running parameter-server job whose --store "
                "HOST:PORT is given (with its KOLO_TOKEN)")
      ->excludes(servers)
      ->excludes(nproc);
  app->add_flag("--tolerate-failures", options->tolerateFailures,
                "a rank other than 0 that fails does not stop the job (federated client hosts)");
  auto* elastic = app->add_flag("--elastic", options->elastic,
                "survivors of a failed rank carry on (kolo train --strategy "
                "multi-worker-mirrored; docs/elastic.md)");
  app->add_option("--min-ranks", options->minRanks,
                  "--elastic: the fewest ranks the job may shrink to (default 1)")
      ->check(atLeast(1))
      ->needs(elastic);
  app->add_option("--max-ranks", options->maxRanks,
                  "--elastic: the most ranks at once; a lost rank is replaced by a new one that "
                  "joins at a step boundary while fewer run (default -n)")
      ->check(atLeast(1))
      ->needs(elastic);
  auto nodes = std::make_shared<std::string>("1");
  auto* nodesOption = app->add_option("--nnodes", *nodes,
                  "nodes in the job (each runs kolo run with the same -n); with --elastic also "
                  "MIN:MAX: nodes 0..MIN-1 start the job, nodes MIN..MAX-1 join it later")
      ->capture_default_str();
  auto* nodeRankOption = app->add_option("--node-rank", options->nodeRank,
                  "this node's index, 0..nnodes-1 (node 0 hosts the store)")
      ->capture_default_str()
      ->check(atLeast(0));
  auto* storeOption = app->add_option(
      "--store", options->storeAddress,
      "HOST:PORT of the rendezvous store ([V6]:PORT for IPv6); required with --nnodes > 1. Node 0 "
      "listens on PORT; default on one node: 127.0.0.1 and a free port");
  app->add_option("--timeout", options->timeoutSeconds,
                  "seconds: the ranks' default collective deadline (KOLO_TIMEOUT) and the nodes' "
                  "rendezvous limit")
      ->check(above(0));
  app->add_option("--debug-dir", options->debugDir,
                  "directory of the ranks' flight recorders (KOLO_DEBUG_DIR): on a failure or a "
                  "stall every rank dumps there and kolo run prints the hang diagnosis");
  app->add_option("--events", options->eventsFile,
                  "append the job's membership and fault events (launch, each rank that failed "
                  "with its signal or exit status, the end) to this JSON-lines file; put it in "
                  "the run directory and kolo report shows them");
  app->add_option("--stall-seconds", options->stallSeconds,
                  "stop the job, with a hang diagnosis, when no rank finished or began a "
                  "collective for this many seconds (default: never)")
      ->check(above(0));
  auto statusFile = std::make_shared<std::string>();
  app->add_option("--status-file", *statusFile,
                  "the ranks of kolo train keep their step and state in FILE.rank-N; another "
                  "terminal shows them with kolo status FILE (sets KOLO_STATUS_FILE)");
  app->add_option("--grace", *graceSeconds,
                  "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str()
      ->check(notBelow(0));
  auto* bindOption = app->add_option("--bind", *bind,
                  "core: bind local rank i to the i-th CPU (modulo their count) this launcher may use, "
                  "as mpirun does; none: leave placement to the scheduler (the default of --ps "
                  "jobs)")
      ->capture_default_str()
      ->check(oneOf({"none", "core"}));
  // Everything from the program name (or from `--`) on belongs to the program, options
  // included: once the first positional word is seen, CLI11 treats the rest as positional.
  app->add_option("program", options->command, "PROGRAM ARGS... (after --)")->required();
  app->positionals_at_end();
  Command command;
  command.app = app;
  command.run = [options, graceSeconds, bind, nproc, bindOption, statusFile, nodes, nodesOption,
                 nodeRankOption, storeOption]() -> int {
    parallel::parseNodeRange(*nodes, *options);
    if (!options->psJoin && nodesOption->count() == 0 && nodeRankOption->count() == 0 && storeOption->count() == 0)
      parallel::nodesFromSlurm(*options);
    // The ranks inherit the launcher's environment (rankEnvironment).
    if (!statusFile->empty() && ::setenv("KOLO_STATUS_FILE", statusFile->c_str(), 1) != 0)
      KOLO_THROW(IoError, "kolo run: cannot set KOLO_STATUS_FILE");
    if (options->psServers > 0 && bindOption->count() == 0) {
      // A server serves every worker from threads of its own and the processes of the job
      // take turns (push, update, reply): bound to one core each, a server shares its core
      // with a worker and the two wait for each other.
      *bind = "none";
    } else if (!options->psJoin && options->psServers == 0 && nproc->count() == 0) {
      KOLO_THROW(InvalidArgument, "kolo run: give -n N (or --ps P --workers W)");
    }
    options->bind = comm::parseCpuBinding(*bind);
    options->gracePeriod = std::chrono::milliseconds(static_cast<int64_t>(*graceSeconds * 1000));
    return parallel::runLauncher(*options);
  };
  return command;
}

}  // namespace kolo::cli
