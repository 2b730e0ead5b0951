// `kolo run`.
#include "cli/commands.h"
#include "kolo/error.h"

namespace kolo::cli {

Command registerRun(CLI::App& root) {
  Command command;
  command.app = root.add_subcommand("run", "run (not available yet)");
  command.run = [] () -> int { KOLO_THROW(Error, "kolo run is not available in this build"); };
  return command;
}

}  // namespace kolo::cli
