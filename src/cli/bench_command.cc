// `kolo bench`.
#include "cli/commands.h"
#include "kolo/error.h"

namespace kolo::cli {

Command registerBench(CLI::App& root) {
  Command command;
  command.app = root.add_subcommand("bench", "bench (not available yet)");
  command.run = [] () -> int { KOLO_THROW(Error, "kolo bench is not available in this build"); };
  return command;
}

}  // namespace kolo::cli
