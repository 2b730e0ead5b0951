// `kolo report`: the group of commands that read what a run left behind. `kolo report hang
// DIR` (report_hang.cc) explains a hang from the ranks' flight recorders.
#include "cli/commands.h"
#include "kolo/error.h"

namespace kolo::cli {

Command registerReport(CLI::App& root) {
  CLI::App* app = root.add_subcommand("report", "read what a run left behind: kolo report hang DIR");
  app->require_subcommand(1);
  auto entries = std::make_shared<std::vector<Command>>();
  entries->push_back(registerReportHang(*app));
  Command command;
  command.app = app;
  command.run = [entries]() -> int {
    for (auto& entry : *entries)
      if (entry.app->parsed()) return entry.run();
    KOLO_THROW(InvalidArgument, "kolo report: name what to report (hang)");
  };
  return command;
}

}  // namespace kolo::cli
