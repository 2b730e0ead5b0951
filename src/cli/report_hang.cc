// `kolo report hang DIR`: merges the flight-recorder dumps of a job (DIR/flight.rank<R>.json,
// written on a Timeout, a Mismatch, SIGUSR1, or by kolo run for a rank that did not answer)
// and prints who waits for whom (kolo/hang_report.h).
#include <cstdio>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "kolo/hang_report.h"

namespace kolo::cli {

Command registerReportHang(CLI::App& report) {
  auto dir = std::make_shared<std::string>();
  auto worldSize = std::make_shared<int>(0);
  CLI::App* app = report.add_subcommand(
      "hang", "explain a hang from the ranks' flight recorders: kolo report hang DIR (the --debug-dir "
              "of kolo run, or KOLO_DEBUG_DIR)");
  app->add_option("dir", *dir, "directory of the flight.rank<R>.json dumps")->required();
  app->add_option("--world-size", *worldSize, "ranks in the job (default: as the dumps say)");
  Command command;
  command.app = app;
  command.run = [dir, worldSize]() -> int {
    for (const std::string& line : observe::diagnoseHang(observe::loadFlightDumps(*dir), *worldSize))
      std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return 0;
  };
  return command;
}

}  // namespace kolo::cli
