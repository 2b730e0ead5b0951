// A job's debugging: the flight-recorder directory, the stall watch (--stall-seconds) that
// asks every rank for its recorder and prints the hang diagnosis before stopping the job,
// and the timeline merged from the ranks' traces at the end.
#include <signal.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kolo/error.h"
#include "kolo/settings.h"
#include "kolo/timeline.h"
#include "launch/job.h"

namespace kolo::parallel::detail {
namespace {

// How long the ranks get to write their flight recorders when asked.
constexpr auto kDumpWait = std::chrono::seconds(2);

}  // namespace

void Job::setUpDebugDirectory(int firstRank) {
  std::string dir = options_.debugDir.empty() ? settings::debugDir() : options_.debugDir;
  if (dir.empty() && options_.stallSeconds > 0) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kolo-debug-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr)
      KOLO_THROW(IoError, "kolo run: cannot create a debug directory ", pattern, ": ",
                 std::strerror(errno));
    dir = pattern;
    say("flight recorders in " + dir);
  }
  if (dir.empty()) return;
  std::vector<int> ranks;
  for (int local = 0; local < options_.procsPerNode; ++local) ranks.push_back(firstRank + local);
  debug_ = std::make_unique<DebugWatch>(dir, options_.stallSeconds, ranks);
}

std::vector<WatchedRank> Job::watchedRanks() const {
  std::vector<WatchedRank> out;
  for (const auto& r : ranks_) out.push_back({r.globalRank, r.pid, r.running});
  return out;
}

void Job::stopAfterDumps(const std::string& reason) {
  if (!debug_ || stopping_) return beginStop(SIGTERM);
  if (debug_->collecting()) return;
  collectReason_ = reason;
  collectDeadline_ = Clock::now() + kDumpWait;
  debug_->requestDumps(watchedRanks());
}

void Job::printDiagnosis() {
  say("hang diagnosis (flight recorders in " + debug_->dir() + "):");
  for (const std::string& line : debug_->finish(watchedRanks(), worldSize_, collectReason_))
    say("  " + line);
}

void Job::watchDebug() {
  if (!debug_ || stopping_) return;
  if (!debug_->collecting() && debug_->stalled(watchedRanks())) {
    char text[64];
    std::snprintf(text, sizeof text, "%g", debug_->stallSeconds());
    say(std::string("no progress from any rank for ") + text +
        " s (--stall-seconds); asking every rank for its flight recorder");
    exitCode_ = 1;
    failure_ = std::string("no progress for ") + text + " s";
    publishFailure(failure_);
    stopAfterDumps("stalled");
  }
  if (debug_->collecting() &&
      (debug_->dumpsSettled(watchedRanks()) || Clock::now() >= collectDeadline_)) {
    printDiagnosis();
    beginStop(SIGTERM);
    signalAll(SIGCONT);  // a stopped rank takes SIGTERM only once continued
  }
}

void Job::mergeTimeline() {
  const std::string dir = settings::timeline();
  if (dir.empty() || options_.nodeRank != 0) return;
  try {
    const observe::MergedTimeline merged = observe::mergeTimeline(dir);
    say("timeline of " + std::to_string(merged.ranks.size()) + " rank(s) written to " +
        merged.path);
  } catch (const Error& e) {
    say(std::string("no timeline: ") + e.what());
  }
}

}  // namespace kolo::parallel::detail
