// The `kolo` subcommands. Each registers itself on the CLI11 app and returns the
// subcommand; main.cc runs whichever was chosen and maps exceptions to exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kolo::cli {

/// A registered subcommand: its CLI11 node and the action to run once parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command registerTrain(CLI::App& root);  // train_command.cc
Command registerRun(CLI::App& root);    // run_command.cc
Command registerBench(CLI::App& root);  // bench_command.cc

}  // namespace kolo::cli
