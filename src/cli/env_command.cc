// `kolo env`: every KOLO_* setting of the registry (kolo/settings.h) with its value here,
// where the value came from (default or environment), and its help; a value that does not
// parse is shown with the reason, and unknown KOLO_* variables are named with a suggestion.
#include <algorithm>
#include <cstdio>
#include <string>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "kolo/settings.h"

namespace kolo::cli {
namespace {

// The value as `kolo env` shows it.
std::string shownValue(const settings::Environment& env, const settings::Declaration& declaration) {
  const std::string text = env.text(declaration.name);
  if (text.empty()) return "(unset)";
  if (declaration.type == settings::Type::Secret) return "(set, hidden)";
  if (declaration.type == settings::Type::Flag && env.problem(declaration.name).empty())
    return env.flag(declaration.name) ? "1" : "0";
  return text;
}

int listSettings(bool showHelp) {
  const settings::Environment env = settings::Environment::process();
  size_t nameWidth = 0, valueWidth = 0;
  std::vector<std::string> values, problems;
  for (const settings::Declaration& declaration : settings::declarations()) {
    values.push_back(shownValue(env, declaration));
    problems.push_back(env.problem(declaration.name));
    nameWidth = std::max(nameWidth, declaration.name.size());
    valueWidth = std::max(valueWidth, values.back().size());
  }
  size_t row = 0;
  for (const settings::Declaration& declaration : settings::declarations()) {
    const bool fromEnvironment = env.source(declaration.name) == settings::Source::Environment;
    std::printf("%-*s  %-*s  %-11s", static_cast<int>(nameWidth), std::string(declaration.name).c_str(),
                static_cast<int>(valueWidth), values[row].c_str(),
                fromEnvironment ? "environment" : "default");
    if (showHelp) {
      std::printf("  %s", std::string(declaration.help).c_str());
      if (!declaration.choices.empty()) {
        std::string choices(declaration.choices);
        std::replace(choices.begin(), choices.end(), '|', ' ');
        std::printf(" [%s]", choices.c_str());
      }
    }
    std::printf("\n");
    if (!problems[row].empty()) std::printf("  ^ not accepted: %s\n", problems[row].c_str());
    ++row;
  }
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
