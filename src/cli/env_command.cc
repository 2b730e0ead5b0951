// `kolo env`: every KOLO_* setting of the registry with its value here, where the value came
// from and its help (settings::listing); unknown KOLO_* variables are named with a suggestion.
#include <cstdio>
#include <string>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "kolo/settings.h"

namespace kolo::cli {
namespace {

int listSettings(bool showHelp) {
  const settings::Environment env = settings::Environment::process();
  std::fputs(settings::listing(env, showHelp).c_str(), stdout);
  std::fflush(stdout);
  for (const std::string& line : settings::unknownVariableWarnings(env))
    std::fprintf(stderr, "kolo: warning: %s\n", line.c_str());
  return 0;
}

}  // namespace

Command registerEnv(CLI::App& root) {
  auto brief = std::make_shared<bool>(false);
  CLI::App* app = root.add_subcommand(
      "env", "list every KOLO_* setting: its value, where it came from (default or environment) "
             "and what it does");
  app->add_flag("--brief", *brief, "name, value and source only");
  Command command;
  command.app = app;
  command.run = [brief] { return listSettings(!*brief); };
  command.warnsAtStart = [] { return false; };  // the listing names unknown variables itself
  return command;
}

}  // namespace kolo::cli
