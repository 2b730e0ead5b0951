// The timeline of a `kolo train` run: started before the job is joined (so the clock
// exchange of the rendezvous sees it), written and merged after the last step.
#include "train/timeline_files.h"

#include "kolo/settings.h"
#include "kolo/timeline.h"
#include "kolo/trace.h"

namespace kolo::train::detail {

std::string startTimeline(const std::string& dir) {
  const std::string chosen = dir.empty() ? settings::timeline() : dir;
  if (chosen.empty()) return "";
  trace::start({.directory = chosen, .writeAtExit = true});
  trace::setThreadName("train");
  return chosen;
}

void finishTimeline(comm::Communicator* comm, bool primary, observe::Logger& logger) {
  if (trace::directory().empty()) return;
  trace::stop();
  trace::writeRankFile();
  if (comm && comm->size() > 1) comm->barrier();
  if (comm && comm->rank() != 0) return;
  const observe::MergedTimeline merged = observe::mergeTimeline(trace::directory());
  if (primary)
    logger.info("timeline written", {{"file", merged.path},
                                     {"ranks", static_cast<int64_t>(merged.ranks.size())},
                                     {"events", merged.events},
                                     {"dropped", merged.dropped}});
}

}  // namespace kolo::train::detail
