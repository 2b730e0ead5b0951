// DebugWatch: the stall watch over the ranks' flight-recorder rings and the collection of
// their dumps for `kolo run`.
#include "launch/debug.h"

#include <signal.h>

#include <fstream>
#include <sstream>

#include "kolo/error.h"
#include "kolo/flight_recorder.h"
#include "kolo/hang_report.h"

namespace kolo::parallel::detail {

namespace fs = std::filesystem;

namespace {
// The least time ranks are given to open their rings before a stall is called.
constexpr double kStartupSeconds = 60;
}  // namespace

DebugWatch::DebugWatch(std::string dir, double stallSeconds, const std::vector<int>& ranks)
    : dir_(std::move(dir)), stallSeconds_(stallSeconds), lastChange_(Clock::now()) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) KOLO_THROW(IoError, "kolo run: cannot create the debug directory ", dir_, ": ", ec.message());
  for (int rank : ranks) {
    fs::remove(flight::dumpPath(dir_, rank), ec);
    fs::remove(flight::ringPath(dir_, rank), ec);
  }
}

bool DebugWatch::stalled(const std::vector<WatchedRank>& ranks) {
  if (stallSeconds_ <= 0 || reported_) return false;
  int64_t progress = 0;
  bool anyRunning = false;
  bool allStarted = true;  // every running rank has opened its ring
  for (const WatchedRank& r : ranks) {
    anyRunning = anyRunning || r.running;
    const int64_t ring = flight::ringProgress(flight::ringPath(dir_, r.globalRank));
    if (ring < 0 && r.running) allStarted = false;
    progress += std::max<int64_t>(0, ring);
  }
  const auto now = Clock::now();
  if (progress != lastProgress_) {
    lastProgress_ = progress;
    lastChange_ = now;
    return false;
  }
  // A rank without a ring is still starting (loading, joining the job: slow on a loaded
  // machine, and under deadlines of its own): until every rank has one, no stall is called
  // before kStartupSeconds, whatever --stall-seconds says.
  const double limit = allStarted ? stallSeconds_ : std::max(stallSeconds_, kStartupSeconds);
  if (!anyRunning || now - lastChange_ < std::chrono::duration<double>(limit)) return false;
  reported_ = true;
  return true;
}

void DebugWatch::requestDumps(const std::vector<WatchedRank>& ranks) {
  collecting_ = true;
  before_.clear();
  for (const WatchedRank& r : ranks) {
    if (!r.running) continue;
    std::error_code ec;
    const auto when = fs::last_write_time(flight::dumpPath(dir_, r.globalRank), ec);
    if (!ec) before_[r.globalRank] = when;
    ::kill(r.pid, SIGUSR1);
  }
}

bool DebugWatch::dumpsSettled(const std::vector<WatchedRank>& ranks) const {
  for (const WatchedRank& r : ranks) {
    if (!r.running) continue;
    std::error_code ec;
    const auto when = fs::last_write_time(flight::dumpPath(dir_, r.globalRank), ec);
    if (ec) return false;
    auto it = before_.find(r.globalRank);
    if (it != before_.end() && when == it->second) return false;
  }
  return true;
}

std::vector<std::string> DebugWatch::finish(const std::vector<WatchedRank>& ranks, int worldSize,
                                            const std::string& reason) {
  collecting_ = false;
  // Every local rank without a fresh dump gets one from its ring: one that did not answer,
  // and one that ended (killed, or its sleep cut short by SIGUSR1) before it wrote one.
  for (const WatchedRank& r : ranks) {
    const std::string dump = flight::dumpPath(dir_, r.globalRank);
    std::error_code ec;
    const auto when = fs::last_write_time(dump, ec);
    auto it = before_.find(r.globalRank);
    const bool fresh = !ec && (it == before_.end() || when != it->second);
    if (fresh) continue;
    std::string note;
    if (r.running) {
      note = processStateNote(r.pid);
      note = "did not answer SIGUSR1" + (note.empty() ? std::string() : "; " + note);
    } else {
      note = "ended without writing a dump";
    }
    note += "; dump written by kolo run from its ring";
    try {
      flight::convertRingFile(flight::ringPath(dir_, r.globalRank), dump, reason, note);
    } catch (const Error&) {
      // No ring (the rank never joined the job): the diagnosis says it sent nothing.
    }
  }
  try {
    return observe::diagnoseHang(observe::loadFlightDumps(dir_), worldSize);
  } catch (const Error& e) {
    return {std::string("no hang diagnosis: ") + e.what()};
  }
}

std::string processStateNote(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return "";
  switch (text[paren + 2]) {
    case 'T': return "the process is stopped (state T: SIGSTOP or a job-control signal)";
    case 't': return "the process is stopped by a debugger (state t)";
    case 'D': return "the process is in uninterruptible sleep (state D: waiting on a device or file system)";
    case 'Z': return "the process has exited (state Z)";
    default: return "";
  }
}

}  // namespace kolo::parallel::detail
