// Entry point of the `kolo` command: dispatches to train, run and bench.
#include <cstdio>
#include <exception>
#include <vector>

#include "cli/commands.h"
#include "kolo/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kolo: distributed deep-learning training"};
  app.require_subcommand(1);
  std::vector<kolo::cli::Command> commands = {
      kolo::cli::registerTrain(app),
      kolo::cli::registerRun(app),
      kolo::cli::registerBench(app),
  };
  CLI11_PARSE(app, argc, argv);
  try {
    for (auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "kolo: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo: unexpected error: %s\n", e.what());
    return 1;
  }
  return 1;
}
