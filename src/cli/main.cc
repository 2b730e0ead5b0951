// Entry point of the `kolo` command: parses the command line, checks the KOLO_* settings,
// runs the chosen subcommand (train, run, bench, env, report, status) and turns what ended it
// into an exit code through the library's table (kolo/exit_codes.h, docs/exit_codes.md), its
// message in the command line's words (library_words.h).
#include <cstdio>
#include <exception>
#include <vector>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/library_words.h"
#include "cli/options.h"
#include "kolo/error.h"
#include "kolo/exit_codes.h"
#include "kolo/settings.h"

namespace {

// Rejects KOLO_* values that do not parse, and warns once per job about unknown KOLO_*
// variables: the ranks that `kolo run` starts (KOLO_RANK set) leave that to the launcher.
void checkSettings() {
  const kolo::settings::Environment env = kolo::settings::Environment::process();
  env.validate();
  if (env.source("KOLO_RANK") == kolo::settings::Source::Environment) return;
  for (const std::string& line : kolo::settings::unknownVariableWarnings(env))
    std::fprintf(stderr, "kolo: warning: %s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kolo: distributed deep-learning training", "kolo"};
  app.require_subcommand(1);
  app.failure_message(kolo::cli::failureMessage);
  std::vector<kolo::cli::Command> commands = {
      kolo::cli::registerTrain(app),
      kolo::cli::registerRun(app),
      kolo::cli::registerBench(app),
      kolo::cli::registerEnv(app),
      kolo::cli::registerReport(app),
      kolo::cli::registerStatus(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and friends end with code 0; every other parse error is a usage error.
    const int code = app.exit(e);
    return code == 0 ? kolo::kExitOk : kolo::kExitUsage;
  }
  try {
    for (auto& command : commands) {
      if (!command.app->parsed()) continue;
      if (command.warnsAtStart()) checkSettings();
      return command.run();
    }
  } catch (const kolo::InternalError& e) {
    std::fprintf(stderr, "kolo: internal error (please report it): %s\n", e.what());
    return kolo::exitCodeFor(e);
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "kolo: error: %s\n", kolo::cli::inFlagWords(e.what()).c_str());
    return kolo::exitCodeFor(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo: unexpected error: %s\n", e.what());
    return kolo::exitCodeFor(e);
  }
  return kolo::kExitInternal;
}
