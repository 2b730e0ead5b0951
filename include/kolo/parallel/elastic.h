// Elastic membership for synchronous data parallelism: a job whose ranks may die keeps
// going with the survivors. Every rank holds the whole model and optimizer state, so when
// a collective fails (PeerError or Timeout) the survivors agree through the store on a new
// generation (its members and the last step every member completed), build a communicator
// over the members with a rendezvous of that generation's own keys, and continue. A rank
// that comes back late, with an older generation, finds the new one formed without it and
// is refused. A rank started later to take a lost one's place (a joiner) registers in the
// store; the members agree at a step boundary that one is waiting (joinerWaiting(), an
// all-reduce) and admit it into the next generation, where it takes the state by broadcast.
// See docs/elastic.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/comm/native.h"
#include "kolo/comm/store.h"
#include "kolo/error.h"

namespace kolo::parallel {

struct ElasticOptions {
  /// The fewest members a generation may have; fewer ends the job (regroup() throws).
  int minRanks = 1;
  /// The most members a generation may have; joiners beyond it wait. 0: the launched size.
  int maxRanks = 0;
  /// Options of every generation's native communicator (timeout: the detection deadline).
  /// storePrefix is replaced by one per generation under `prefix`.
  comm::NativeOptions native;
  /// How long each generation's rendezvous may take (the ranks of generation 0 may start
  /// far apart); the communicator's deadline afterwards is native.timeout.
  std::chrono::milliseconds rendezvousTimeout{std::chrono::minutes(5)};
  /// Key prefix of the membership records in the store.
  std::string prefix = "kolo-elastic";
  /// Called by regroup() once the members of a generation are agreed, before its
  /// communicator is built (to log the change, or to fail at that moment on purpose: a
  /// failure during the change itself is recovered like any other).
  std::function<void(int64_t generation)> onAgreed;
};

/// What one membership change decided.
struct MembershipChange {
  int64_t generation = 0;
  /// Launch ranks (ids) of the members, ascending; this rank's new rank is its index.
  std::vector<int> members;
  /// Launch ranks of the previous generation that are not members any more.
  std::vector<int> lost;
  /// Launch ranks admitted by this change (joiners), ascending; join()'s names itself.
  std::vector<int> joined;
  /// The last step every member completed: each member continues from the state after it.
  int64_t step = 0;
  /// When the first member began this change (called regroup()): for a change after a
  /// failure, about when the loss was first seen, which a survivor that waited longer on its
  /// collective did not see itself. The epoch (unset) when unknown.
  std::chrono::system_clock::time_point firstReport{};
};

/// regroup()'s error when fewer than minRanks members are left: `change` is what was agreed
/// (its members and their common step), so that a member can save the state after
/// change.step (a checkpoint) before the job stops.
class BelowMinRanksError : public Error {
 public:
  BelowMinRanksError(const std::string& what, MembershipChange change)
      : Error(what), change_(std::move(change)) {}
  const MembershipChange& change() const { return change_; }

 private:
  MembershipChange change_;
};

/// One rank's view of an elastic job. Generation 0 is every launched rank. Not thread-safe.
class ElasticContext {
 public:
  /// Collective over the `size` launched ranks: builds generation 0's communicator.
  /// `id` is this rank's launch rank (it never changes). Throws what
  /// comm::createNativeCommunicator throws, InvalidArgument for a bad id, size or minRanks.
  ElasticContext(std::shared_ptr<comm::Store> store, int id, int size, ElasticOptions options = {});
  ~ElasticContext();

  /// From `kolo run --elastic`'s variables (KOLO_RANK, KOLO_WORLD_SIZE, KOLO_STORE,
  /// KOLO_TOKEN, KOLO_ELASTIC_MIN_RANKS, KOLO_TIMEOUT). Throws InvalidArgument outside
  /// such a job.
  /// `options` gives the rest (minRanks and native.timeout are replaced by the variables').
  /// Under KOLO_ELASTIC_JOIN (a rank the launcher started in a lost one's place) it joins
  /// instead: see join(). maxRanks comes from KOLO_ELASTIC_MAX_RANKS when set.
  static std::unique_ptr<ElasticContext> fromEnvironment(ElasticOptions options = {});
  /// A new rank `id` (a launch rank no member has) joins the running job: it registers in
  /// the store and blocks until a generation admits it (the members agree on it at a step
  /// boundary: joinerWaiting()), then builds that generation's communicator and returns;
  /// change() says what was agreed (its step is where the members continue from; the state
  /// comes by broadcast from rank 0 of the new communicator). Returns null when the job
  /// finished (finish()) before admitting it. Throws Timeout when no generation admitted it
  /// within the rendezvous time, PeerError as regroup() does.
  static std::unique_ptr<ElasticContext> join(std::shared_ptr<comm::Store> store, int id,
                                              ElasticOptions options = {});
  /// True when this process was started by kolo run --elastic.
  static bool launchedElastic();

  int id() const { return id_; }
  int64_t generation() const { return generation_; }
  const std::vector<int>& members() const { return members_; }
  /// This rank's index among the members, and their number.
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  int minRanks() const { return options_.minRanks; }
  int maxRanks() const { return options_.maxRanks; }
  /// The change that admitted this rank (join()), else the last regroup()'s.
  const MembershipChange& change() const { return change_; }
  /// The current generation's communicator (null only while regroup() runs).
  const std::shared_ptr<comm::Communicator>& communicator() const { return comm_; }
  /// The job's store, which the members agree through.
  const std::shared_ptr<comm::Store>& store() const { return store_; }

  /// Called by every survivor after a collective failed; `completedStep` is the number of
  /// steps this rank completed (applied). Drops this rank's reference to the old
  /// communicator (the caller must drop its own first, so that peers still waiting on it
  /// see it closed), then agrees on the next generation: its members are the previous
  /// members that report here before the lost ones are all known (marked through
  /// elasticLostKey) or twice the detection deadline passes; its step is the least
  /// `completedStep` of its members. Builds the new communicator (its rendezvous has the
  /// detection deadline: the members are running already) and returns the change. When a
  /// member fails during the change (the rendezvous fails with PeerError or Timeout), the
  /// others agree on the generation after it in the same call: the change returned then
  /// spans both, `lost` naming every rank lost since the previous generation.
  /// Throws PeerError when the generation was formed without this rank (it came too
  /// late), BelowMinRanksError naming the lost ranks when fewer than minRanks members are
  /// left.
  MembershipChange regroup(int64_t completedStep, const std::string& reason);

  /// Collective over the members, at a step boundary: true on every member when any of
  /// them sees a registered joiner that is not yet admitted (an all-reduce of what each
  /// read in the store, since the reads may differ). Then every member calls regroup() at
  /// the same step, which admits the joiners. False without a collective when the
  /// generation has maxRanks members already. Throws what the all-reduce throws.
  bool joinerWaiting();
  /// Blocks until enough joiners that are not yet admitted have registered to fill the
  /// generation to maxRanks, or `timeout` passes (then throws Timeout). For tests: makes the
  /// admission happen at a chosen step.
  void awaitJoiners(std::chrono::milliseconds timeout);
  /// Tells ranks still waiting in join() that the job is over (they return null). Called
  /// by a member once training ended; regroup() calls it when the job falls below minRanks.
  void finish(const std::string& why);

 private:
  ElasticContext(std::shared_ptr<comm::Store> store, int id, ElasticOptions options);
  void connect();
  MembershipChange agree(int64_t completedStep, const std::string& reason);
  /// Builds the agreed generation's communicator; when a member fails meanwhile, agrees on
  /// the next one. `before`: the members before the change, for its lost and joined ranks.
  MembershipChange establish(MembershipChange change, const std::vector<int>& before);
  /// How many joiners have registered (their tickets are 1..count).
  int64_t joinersRegistered();
  std::string key(const std::string& name) const { return options_.prefix + "/" + name; }

  std::shared_ptr<comm::Store> store_;
  int id_ = 0;
  ElasticOptions options_;
  int64_t generation_ = 0;
  std::vector<int> members_;
  int rank_ = 0;
  /// Joiner tickets (the store's counter) already decided on by a generation.
  int64_t admitted_ = 0;
  MembershipChange change_;
  std::shared_ptr<comm::Communicator> comm_;
};

}  // namespace kolo::parallel
