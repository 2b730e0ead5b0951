// `kolo status FILE`: every rank's step and state while a job runs, from the FILE.rank-N
// lines that `kolo train` keeps (kolo run --status-file FILE, or KOLO_STATUS_FILE), with how
// long ago each was written and whether its process is still there.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

namespace fs = std::filesystem;

struct RankLine {
  int rank = 0;
  nlohmann::json fields;
};

std::vector<RankLine> readRanks(const std::string& file) {
  const fs::path base(file);
  const fs::path dir = base.has_parent_path() ? base.parent_path() : fs::path(".");
  const std::string prefix = base.filename().string() + ".rank-";
  std::error_code error;
  fs::directory_iterator entries(dir, error);
  if (error) KOLO_THROW(FileError, "kolo status: cannot read the directory ", dir.string(), ": ", error.message());
  std::vector<RankLine> ranks;
  for (const fs::directory_entry& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string suffix = name.substr(prefix.size());
    if (suffix.empty() || !std::all_of(suffix.begin(), suffix.end(), ::isdigit)) continue;
    std::ifstream in(entry.path());
    std::string line;
    std::getline(in, line);
    nlohmann::json fields = nlohmann::json::parse(line, nullptr, false);
    if (fields.is_discarded() || !fields.is_object())
      KOLO_THROW(FormatError, "kolo status: ", entry.path().string(), " is not a status line");
    ranks.push_back({std::stoi(suffix), std::move(fields)});
  }
  std::sort(ranks.begin(), ranks.end(), [](const RankLine& a, const RankLine& b) { return a.rank < b.rank; });
  return ranks;
}

int showStatus(const std::string& file) {
  const std::vector<RankLine> ranks = readRanks(file);
  if (ranks.empty())
    KOLO_THROW(FileError, "kolo status: no rank has written ", file,
               ".rank-N yet (start the job with kolo run --status-file ", file,
               " or KOLO_STATUS_FILE=", file, ")");
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::printf("%-5s %-8s %-11s %-13s %-8s %-9s %-10s %s\n", "rank", "pid", "state", "step", "loss",
              "step_ms", "samples/s", "updated");
  int64_t slowestStep = -1, fastestStep = -1;
  int slowest = -1;
  for (const RankLine& r : ranks) {
    const nlohmann::json& f = r.fields;
    std::string state = f.value("state", "?");
    const int64_t pid = f.value("pid", int64_t{0});
    // A process that is gone without saying so (killed) is shown as such.
    if ((state != "done" && state != "failed") && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 &&
        errno == ESRCH)
      state += "(gone)";
    const int64_t step = f.value("step", int64_t{0});
    char stepText[32];
    std::snprintf(stepText, sizeof stepText, "%lld/%lld", static_cast<long long>(step),
                  static_cast<long long>(f.value("total_steps", int64_t{0})));
    std::printf("%-5d %-8lld %-11s %-13s %-8.4f %-9.2f %-10.0f %.1f s ago\n", r.rank,
                static_cast<long long>(pid), state.c_str(), stepText, f.value("loss", 0.0),
                1e3 * f.value("step_s", 0.0), f.value("samples_per_s", 0.0),
                now - f.value("updated", now));
    if (state == "training" && (slowestStep < 0 || step < slowestStep)) {
      slowestStep = step;
      slowest = r.rank;
    }
    fastestStep = std::max(fastestStep, step);
  }
  if (slowest >= 0 && fastestStep > slowestStep)
    std::printf("behind: rank %d (step %lld; the furthest rank is at step %lld)\n", slowest,
                static_cast<long long>(slowestStep), static_cast<long long>(fastestStep));
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
