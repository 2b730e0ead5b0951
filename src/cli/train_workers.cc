// `kolo train --workers N`: this process becomes the launcher of N local ranks of the same
// command, as `kolo run -n N` would start them, so one command trains on N ranks.
#include <filesystem>
#include <fstream>

#include "cli/train_loop.h"
#include "kolo/comm/init.h"
#include "kolo/error.h"
#include "launch/launcher.h"

namespace kolo::cli {
namespace {

// [self, "train", the train arguments without --workers...], with `--strategy
// multi-worker-mirrored` when they name no strategy. `trainArgs`: the words after "train".
std::vector<std::string> workersCommandLine(const std::string& self, int workers,
                                            const std::vector<std::string>& trainArgs) {
  std::vector<std::string> args;
  bool strategyNamed = false;
  for (size_t i = 0; i < trainArgs.size(); ++i) {
    const std::string& word = trainArgs[i];
    if (word == "--workers") {
      ++i;  // and its value
      continue;
    }
    if (word.rfind("--workers=", 0) == 0) continue;
    std::string strategy;
    if (word == "--strategy" && i + 1 < trainArgs.size()) strategy = trainArgs[i + 1];
    if (word.rfind("--strategy=", 0) == 0) strategy = word.substr(11);
    if (!strategy.empty()) {
      KOLO_REQUIRE(strategy == "multi-worker-mirrored" || strategy == "fsdp", "--workers ",
                   workers, " runs --strategy multi-worker-mirrored or fsdp, not '", strategy, "'");
      strategyNamed = true;
    }
    args.push_back(word);
  }
  std::vector<std::string> command = {self, "train"};
  if (!strategyNamed) {
    command.push_back("--strategy");
    command.push_back("multi-worker-mirrored");
  }
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

// The words after "train" on this process's command line (/proc/self/cmdline).
std::vector<std::string> ownTrainArgs() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in.good()) KOLO_THROW(IoError, "--workers: cannot read /proc/self/cmdline");
  std::vector<std::string> words;
  for (std::string word; std::getline(in, word, '\0');) words.push_back(word);
  for (size_t i = 1; i < words.size(); ++i) {
    if (words[i] == "train") return {words.begin() + static_cast<long>(i) + 1, words.end()};
  }
  KOLO_THROW(InvalidArgument, "--workers: no 'train' word on the command line");
}

}  // namespace

int runWorkers(int workers) {
  const comm::LaunchInfo launch = comm::detectLaunch();
  KOLO_REQUIRE(launch.launcher == "single", "--workers ", workers,
               " inside a job already launched by ", launch.launcher, " (rank ", launch.rank,
               " of ", launch.size, "): drop --workers or the outer launcher");
  std::error_code error;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (error) self = "/proc/self/exe";
  parallel::LauncherOptions options;
  options.procsPerNode = workers;
  options.command = workersCommandLine(self, workers, ownTrainArgs());
  return parallel::runLauncher(options);
}

}  // namespace kolo::cli
