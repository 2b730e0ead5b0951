// `kolo train`.
#include "cli/commands.h"
#include "kolo/error.h"

namespace kolo::cli {

Command registerTrain(CLI::App& root) {
  Command command;
  command.app = root.add_subcommand("train", "train (not available yet)");
  command.run = [] () -> int { KOLO_THROW(Error, "kolo train is not available in this build"); };
  return command;
}

}  // namespace kolo::cli
