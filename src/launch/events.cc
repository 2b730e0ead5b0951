// JobEvents: `kolo run`'s event lines. A rank killed by a signal is named with the signal
// (SIGKILL, SIGSEGV...), and whether kolo run sent it while stopping the job or it came from
// elsewhere (the OOM killer, a user's kill, a crash).
#include "launch/events.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

namespace kolo::parallel::detail {

JobEvents::JobEvents(const std::string& path) {
  if (!path.empty()) writer_ = std::make_unique<observe::MetricsWriter>(path, true);
}

void JobEvents::write(observe::Fields fields) {
  if (!writer_) return;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  fields.set("wall_s", wall).set("source", "kolo run");
  try {
    writer_->write(fields);
  } catch (const std::exception&) {
    // Events are a record, not the job: a full disk must not stop it.
  }
}

void JobEvents::started(int ranks, int localRanks, int firstRank) {
  write({{"kind", "event"}, {"event", "launched"}, {"ranks", ranks}, {"local_ranks", localRanks},
         {"first_rank", firstRank}});
}

void JobEvents::rankFailed(int rank, pid_t pid, int status, bool stopping, const std::string& role) {
  observe::Fields fields{{"kind", "event"}, {"event", "failed"}, {"rank", rank}, {"pid", static_cast<int64_t>(pid)}};
  if (!role.empty()) fields.set("role", role);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::sigabbrev_np(sig);
    fields.set("signal", name ? std::string("SIG") + name : std::to_string(sig)).set("signal_number", sig);
    fields.set("cause", stopping ? "stopped by kolo run" : "killed by a signal from outside kolo run");
    if (WCOREDUMP(status)) fields.set("core_dumped", true);
  } else if (WIFEXITED(status)) {
    fields.set("exit_status", WEXITSTATUS(status));
    fields.set("cause", stopping ? "exited while kolo run stopped the job" : "exited with an error");
  }
  write(std::move(fields));
}

void JobEvents::ended(int exitCode, const std::string& failure) {
  observe::Fields fields{{"kind", "event"}, {"event", failure.empty() ? "job end" : "job failed"},
                         {"exit_code", exitCode}};
  if (!failure.empty()) fields.set("reason", failure);
  write(std::move(fields));
}

}  // namespace kolo::parallel::detail
