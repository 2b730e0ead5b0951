// `kolo status FILE`: every rank's step and state while a job runs, from the FILE.rank-N
// lines that fit and the parameter servers keep (kolo run --status-file FILE, or
// KOLO_STATUS_FILE), with how long ago each was written and whether its process is still there.
#include <chrono>
#include <cstdio>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "kolo/error.h"
#include "kolo/train/fit.h"

namespace kolo::cli {
namespace {

int showStatus(const std::string& file) {
  const std::vector<train::RankStatusLine> ranks = train::readRankStatus(file);
  if (ranks.empty())
    KOLO_THROW(FileError, "kolo status: no rank has written ", file,
               ".rank-N yet: the job has not begun training, was not started with kolo run "
               "--status-file ", file, " (or KOLO_STATUS_FILE=", file,
               "), or trains in a loop of its own rather than train::fit or the parameter servers");
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fputs(train::rankStatusTable(ranks, now).c_str(), stdout);
  return 0;
}

}  // namespace

Command registerStatus(CLI::App& root) {
  auto file = std::make_shared<std::string>();
  CLI::App* app = root.add_subcommand(
      "status", "every rank's step and state of a running job: kolo status FILE (the file given "
                "to kolo run --status-file)");
  app->add_option("file", *file, "the status file")->required();
  Command command;
  command.app = app;
  command.run = [file] { return showStatus(*file); };
  return command;
}

}  // namespace kolo::cli
