// The `kolo` subcommands. Each registers itself on the CLI11 app and returns the
// subcommand; main.cc runs whichever was chosen and maps exceptions to exit codes
// (kolo/exit_codes.h).
#pragma once

#include <functional>

// CLI11 is heavy to parse: only the command files that build options include it.
namespace CLI {
class App;
}  // namespace CLI

namespace kolo::cli {

/// A registered subcommand: its CLI11 node and the action to run once parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
  /// Whether main.cc checks the KOLO_* settings and warns about unknown ones before run;
  /// commands that do it themselves, or that re-launch kolo, set it false.
  std::function<bool()> warnsAtStart = [] { return true; };
};

Command registerTrain(CLI::App& root);  // train_command.cc
Command registerRun(CLI::App& root);    // run_command.cc
Command registerBench(CLI::App& root);  // bench_command.cc
Command registerEnv(CLI::App& root);    // env_command.cc
Command registerReport(CLI::App& root);  // report_command.cc: kolo report RUN_DIR..., and its group
Command registerReportHang(CLI::App& report);  // report_hang.cc: `kolo report hang DIR`
Command registerStatus(CLI::App& root);  // status_command.cc

}  // namespace kolo::cli
