// What a rank that ended means for `kolo run`'s job: reap-and-blame (the likeliest cause
// of a failure stops the others), and the rules under which the job goes on without it:
// --elastic (survivors regroup while at least --min-ranks run), parameter-server workers
// (the chief hands a lost worker's data to the others) and tolerated failures.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>

#include "parallel/elastic/store_keys.h"
#include "kolo/error.h"
#include "kolo/parallel/elastic.h"
#include "launch/job.h"

namespace kolo::parallel::detail {
namespace {

constexpr char kNextRankKey[] = "kolo-run/replacements";  // the count of replacements started

/// How long a rank that exited with "another rank failed" (5) waits to be blamed while its
/// peers still run: the rank whose failure it saw may not be reaped yet (a SIGKILLed process
/// closes its sockets before its exit is reported, and on a busy host the peer can exit in
/// between).
constexpr auto kBlameWait = std::chrono::seconds(2);

/// How likely a rank's end is the cause of a job's failure: killed by a signal (2), an
/// error of its own (1), or kolo's exit code for "another rank failed or vanished" (0).
int blamePriority(int status) {
  if (WIFSIGNALED(status)) return 2;
  return WIFEXITED(status) && WEXITSTATUS(status) == 5 ? 0 : 1;
}

/// kolo's status for a flag or setting that is not accepted (and most tools' for a usage
/// error): a replacement runs the same command and would fail the same way.
bool usageError(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 2; }

}  // namespace

void Job::reap() {
  // Several ranks may have ended since the last pass: when one rank dies (say by SIGKILL)
  // its peers' collectives fail and they exit soon after. Blame a rank killed by a
  // signal first, then one that exited with an error of its own, and last one whose
  // status is kolo's "another rank failed" (5), as the likelier causes come first.
  Rank* blamed = nullptr;
  for (auto& r : ranks_) {
    if (!r.running) continue;
    int status = 0;
    pid_t got = ::waitpid(r.pid, &status, WNOHANG);
    if (got != r.pid) continue;
    r.running = false;
    r.status = status;
    bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && events_) events_->rankFailed(r.globalRank, r.pid, status, stopping_, r.role);
    if (failed && !stopping_ && options_.tolerateFailures && r.globalRank != 0) {
      say("rank " + std::to_string(r.globalRank) + " (pid " + std::to_string(r.pid) + ") " +
          describeStatus(status) + "; the job goes on without it");
      continue;
    }
    if (failed && !stopping_ && options_.elastic) {
      // Below --min-ranks the survivors stop by themselves (see loseElasticRank): their
      // errors are the expected end, not new failures.
      if (survivorsDeadline_ || loseElasticRank(r)) continue;
      blamed = &r;
      break;
    }
    if (failed && !stopping_ && r.role == "worker" && !options_.psJoin) {
      // The chief hands a lost worker's data to the others: the job goes on.
      say("worker " + std::to_string(r.roleIndex) + " (rank " + std::to_string(r.globalRank) +
          ", pid " + std::to_string(r.pid) + ") " + describeStatus(status) +
          "; the job goes on without it");
      continue;
    }
    if (failed && !stopping_ && !(debug_ && debug_->collecting()) &&
        (!blamed || blamePriority(status) > blamePriority(blamed->status)))
      blamed = &r;
  }
  blamed = settleBlame(blamed);
  if (blamed) {
    std::string what = describeRank(*blamed) + " (pid " + std::to_string(blamed->pid) + ") " +
                       describeStatus(blamed->status);
    if (options_.elastic && usageError(blamed->status))
      what = "elastic job: " + what + ", a usage error that a replacement would repeat";
    else if (options_.elastic)
      what =
          "elastic job below --min-ranks " + std::to_string(options_.minRanks) + " after " + what;
    say(what + "; stopping the other ranks");
    exitCode_ = exitCodeFor(blamed->status);
    failure_ = what;
    publishFailure(what);
    stopAfterDumps("a rank failed");
  }
  // Last: starting a rank adds to ranks_ (blamed points into it).
  if (!replace_.empty()) startReplacements();
}

Rank* Job::settleBlame(Rank* blamed) {
  if (stopping_) {
    waitingBlame_.reset();
    return nullptr;
  }
  if (waitingBlame_) {
    Rank& earlier = ranks_[*waitingBlame_];
    if (!blamed || blamePriority(blamed->status) == 0) blamed = &earlier;
  }
  if (!blamed || options_.elastic || blamePriority(blamed->status) > 0 || !anyRunning()) {
    waitingBlame_.reset();
    return blamed;
  }
  if (!waitingBlame_) {
    waitingBlame_ = static_cast<size_t>(blamed - ranks_.data());
    waitingBlameUntil_ = Clock::now() + kBlameWait;
  }
  if (Clock::now() < waitingBlameUntil_) return nullptr;
  waitingBlame_.reset();
  return blamed;
}

bool Job::loseElasticRank(const Rank& r) {
  // A usage error ends the job as without --elastic (the other nodes' launchers read the
  // published failure): replacing the rank would only start the same failure again, over
  // and over across nodes, where no launcher counts the members.
  if (usageError(r.status)) return false;
  const std::string what = "rank " + std::to_string(r.globalRank) + " (pid " +
                           std::to_string(r.pid) + ") " + describeStatus(r.status);
  try {
    store_->setString(parallel::elasticLostKey(r.globalRank), what);
  } catch (const Error& e) {
    say(std::string("could not mark rank ") + std::to_string(r.globalRank) +
        " lost in the store: " + e.what());
  }
  if (nodes() > 1) return loseElasticRankAcrossNodes(r, what);
  const int left = runningMembers();
  if (left >= options_.minRanks) {
    say(what + "; the elastic job goes on with " + std::to_string(left) + " rank(s)");
    replace_.emplace_back(r.localRank, r.globalRank);
    return true;
  }
  say(what + "; " + std::to_string(left) + " rank(s) left, below --min-ranks " +
      std::to_string(options_.minRanks));
  if (left == 0) return false;
  const double detection = options_.timeoutSeconds > 0 ? options_.timeoutSeconds : 300.0;
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::duration<double>(3 * detection)) +
                    options_.gracePeriod;
  failure_ =
      "elastic job below --min-ranks " + std::to_string(options_.minRanks) + " after " + what;
  exitCode_ = exitCodeFor(r.status);
  survivorsDeadline_ = Clock::now() + wait;
  say("waiting up to " + std::to_string(wait.count() / 1000) +
      " s for the other rank(s) to stop by themselves (after a checkpoint, with --checkpoint-dir)");
  return true;
}

bool Job::loseElasticRankAcrossNodes(const Rank& r, const std::string& what) {
  std::string over;  // why the job is over, once a member said so
  try {
    if (store_->check({parallel::elasticFinishedKey()}))
      over = store_->getString(parallel::elasticFinishedKey(), std::chrono::seconds(5));
  } catch (const Error& e) {
    over = std::string("the store is gone: ") + e.what();
  }
  if (over.empty()) {
    say(what + "; the elastic job goes on without it");
    replace_.emplace_back(r.localRank, r.globalRank);
    return true;
  }
  // The members stopped the job (below --min-ranks): this rank's end is part of that.
  say(what + "; the elastic job is over: " + over);
  if (failure_.empty()) {
    failure_ = what + " (" + over + ")";
    exitCode_ = exitCodeFor(r.status);
  }
  return true;
}

void Job::stopLateSurvivors() {
  if (!survivorsDeadline_ || stopping_ || Clock::now() < *survivorsDeadline_) return;
  say(failure_ + "; the other rank(s) did not stop by themselves; stopping them");
  stopAfterDumps("a rank failed");
}

void Job::endLostWorkers() {
  if (stopping_ || psServers_ == 0) return;
  bool workersLeft = false;
  for (const auto& r : ranks_) {
    if (!r.running) continue;
    if (r.role != "worker") return;  // the chief or a server is still at work
    workersLeft = true;
  }
  if (!workersLeft) return;
  bool chiefDone = false;  // this launcher started the chief, and it succeeded
  for (const auto& r : ranks_)
    if (r.role == "chief") chiefDone = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
  if (!chiefDone) return;
  const auto now = Clock::now();
  if (!lostWorkersDeadline_) {
    lostWorkersDeadline_ = now + options_.gracePeriod;
    return;
  }
  if (now < *lostWorkersDeadline_) return;
  for (auto& r : ranks_) {
    if (!r.running || r.role != "worker" || r.killedAsLost) continue;
    say("worker " + std::to_string(r.roleIndex) + " (rank " + std::to_string(r.globalRank) +
        ", pid " + std::to_string(r.pid) + ") still runs " +
        std::to_string(options_.gracePeriod.count()) +
        " ms after the chief finished the job without it; sending SIGKILL");
    ::kill(-r.pid, SIGKILL);
    r.killedAsLost = true;
  }
}

int Job::runningMembers() {
  int members = 0;
  for (const auto& r : ranks_) {
    if (!r.running) continue;
    bool admitted = !r.joiner;
    try {
      admitted = admitted || store_->check({parallel::elasticAdmittedKey(r.globalRank)});
    } catch (const Error& e) {
      say("could not read whether rank " + std::to_string(r.globalRank) + " joined: " + e.what());
    }
    members += admitted ? 1 : 0;
  }
  return members;
}

void Job::startReplacements() {
  std::vector<std::pair<int, int>> lost;
  lost.swap(replace_);
  if (stopping_ || survivorsDeadline_) return;
  for (const auto& [localRank, lostRank] : lost) {
    // This node gets back to its -n ranks; the generations admit at most maxRanks().
    int running = 0;
    for (const auto& r : ranks_) running += r.running ? 1 : 0;
    if (running >= options_.procsPerNode || replacements_ >= maxRanks()) {
      say("rank " + std::to_string(lostRank) + " is not replaced: " +
          (running >= options_.procsPerNode
               ? std::to_string(running) + " rank(s) run on this node (-n)"
               : std::to_string(replacements_) + " replacements started here, as many as --max-ranks"));
      continue;
    }
    Rank joiner;
    // Launch ranks beyond every node's own, unique across the nodes (a counter in the store).
    int64_t ticket = 0;
    try {
      ticket = store_->add(kNextRankKey, 1);
    } catch (const Error& e) {
      say("rank " + std::to_string(lostRank) + " is not replaced: " + e.what());
      continue;
    }
    joiner.globalRank = nodes() * options_.procsPerNode + static_cast<int>(ticket) - 1;
    joiner.localRank = localRank;  // its CPU and local slot
    joiner.joiner = true;
    ranks_.push_back(std::move(joiner));
    ++replacements_;
    if (start(ranks_.back(), {{"KOLO_ELASTIC_JOIN", "1"}}))
      say("starting rank " + std::to_string(ranks_.back().globalRank) + " (pid " +
          std::to_string(ranks_.back().pid) + ") in the place of rank " + std::to_string(lostRank) +
          "; it joins at a step boundary");
  }
}

}  // namespace kolo::parallel::detail
