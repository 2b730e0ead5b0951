// `kolo report`: the group of commands that read what runs left behind. `kolo report
// RUN_DIR [RUN_DIR...] [-o OUT]` writes OUT/index.html (self-contained: the plots inline)
// and OUT/<plot>.svg from the runs' metrics, checkpoints and timelines; `kolo report hang
// DIR` (report_hang.cc) explains a hang from the ranks' flight recorders.
#include <filesystem>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "report/html.h"
#include "report/runs.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

int writeReport(const std::vector<std::string>& dirs, std::string out) {
  KOLO_REQUIRE(!dirs.empty(), "kolo report: give one or more run directories (where kolo train "
               "--metrics wrote its file), e.g. kolo report runs/a runs/b -o report");
  std::vector<report::Run> runs;
  for (const std::string& dir : dirs) runs.push_back(report::readRun(dir));
  if (out.empty()) out = dirs.size() == 1 ? (std::filesystem::path(dirs[0]) / "report").string() : "report";
  const report::WrittenReport written = report::writeReport(runs, out);
  std::printf("wrote %s: %zu run(s), %d of %zu plots drawn\n", written.page.c_str(), runs.size(), written.drawn,
              written.plots);
  // Fault events on the terminal too: a rank that failed is the first thing to know.
  for (const std::string& line : report::failureLines(runs)) std::printf("%s\n", line.c_str());
  return 0;
}

// The subcommands of the group other than the page itself (`kolo report NAME ...`): each
// registers on the group's node; the one chosen runs instead of the page.
std::vector<Command> registerReportSubcommands(CLI::App& report) {
  return {registerReportHang(report)};
}

}  // namespace

Command registerReport(CLI::App& root) {
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  CLI::App* app = root.add_subcommand(
      "report", "an HTML report with plots of one or more runs: kolo report RUN_DIR... [-o OUT]");
  app->add_option("runs", *dirs, "run directories (each holding a kolo train --metrics file)");
  app->add_option("-o,--output", *out,
                  "directory for index.html and the SVG plots (default RUN_DIR/report for one "
                  "run, ./report for several)");
  auto subcommands = std::make_shared<std::vector<Command>>(registerReportSubcommands(*app));
  Command command;
  command.app = app;
  command.run = [dirs, out, subcommands] {
    for (Command& sub : *subcommands)
      if (sub.app->parsed()) return sub.run();
    return writeReport(*dirs, *out);
  };
  return command;
}

}  // namespace kolo::cli
