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
  std::printf("%-5s %-8s %-13s %-13s %-6s %-8s %-9s %-10s %s\n", "rank", "pid", "state", "step", "epoch",
              "loss", "step_ms", "samples/s", "updated");
  for (const train::RankStatusLine& r : ranks) {
    const std::string state = r.gone ? r.state + "(gone)" : r.state;
    char stepText[32];
    std::snprintf(stepText, sizeof stepText, "%lld/%lld", static_cast<long long>(r.step),
                  static_cast<long long>(r.totalSteps));
    std::printf("%-5d %-8lld %-13s %-13s %-6lld %-8.4f %-9.2f %-10.0f %.1f s ago\n", r.rank,
                static_cast<long long>(r.pid), state.c_str(), stepText, static_cast<long long>(r.epoch),
                r.loss, 1e3 * r.stepSeconds, r.samplesPerSecond, now - (r.updated > 0 ? r.updated : now));
  }
  if (const train::Straggler behind = train::findStraggler(ranks); behind.rank >= 0)
    std::printf("behind: rank %d (step %lld; the furthest rank is at step %lld)\n", behind.rank,
                static_cast<long long>(behind.step), static_cast<long long>(behind.furthestStep));
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
