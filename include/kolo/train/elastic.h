// ElasticEngine: synchronous data parallelism whose job survives the loss of ranks and
// admits new ones, in the manner of Horovod's elastic State (commit / restore / sync) and
// torchelastic, driven by the same train::fit loop as every other engine. Each generation of
// members (parallel::ElasticContext) trains through a DataParallelEngine over its own
// communicator; the engine keeps the state after the last two completed steps in memory, and
// when a step fails (a member died) or a joiner waits at a step boundary, the members agree
// on the next generation, go back to the state after the step every member completed, and
// hand that state to the joiners by broadcast. fit then repositions its loader for the new
// shard, so every global batch is still the same samples in the same order: the updates are
// those of one device. See docs/elastic.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/error.h"
#include "kolo/observe.h"
#include "kolo/parallel/elastic.h"
#include "kolo/train/engine.h"

namespace kolo::train {

/// How an ElasticEngine trains and reports.
struct ElasticEngineOptions {
  /// The settings of every generation's DataParallelEngine: the strategy must be
  /// multi-worker-mirrored (InvalidArgument otherwise); its communicator (may be null) is
  /// each generation's; the reducer's overlap and sharded update are turned off (a step that
  /// fails must leave every member's state whole). The loss, the buckets, the algorithm and
  /// balancing (balanceBatch: each generation starts from the even split) apply as given;
  /// clipNorm and a communication hook are refused (InvalidArgument).
  DataParallelOptions dataParallel{};
  /// Log lines: a failed step, each membership change (by the new rank 0), a joiner's
  /// admission, the recovery. Null: stderr.
  observe::Logger* logger = nullptr;
  /// Called on every member when the first step after a membership change that lost ranks
  /// completes, with the "recovered" event's fields (step, generation, world_size,
  /// recovery_s: from the first member's entry into the change, about when the loss was
  /// first seen); it may add fields (a benchmark's time since the kill it caused).
  std::function<void(observe::Fields&)> onRecovered{};
};

/// Something that happened to the job's membership, for the metrics (fit writes each as an
/// event line {"kind":"event","event":name,"step":step,...fields}).
struct ElasticEvent {
  std::string name;  // "membership" (ranks lost), "joined", "recovered"
  int64_t step = 0;  // the steps done when it happened (where the members continue from)
  observe::Fields fields{};
};

/// Data parallelism over the members of an elastic job. The Engine calls behave as
/// DataParallelEngine's over the current generation (rank(), dataShard() and communicator()
/// change with it); the calls below are the elastic protocol that train::fit drives around
/// them (a user's own loop may drive it the same way). Not thread-safe.
class ElasticEngine : public Engine {
 public:
  /// Builds the current generation's engine over `context`'s communicator. A member of
  /// generation 0 starts from the factories' weights (rank 0's, as DataParallelEngine); a
  /// joiner (its context from ElasticContext::join or fromEnvironment under
  /// KOLO_ELASTIC_JOIN) receives the state after context->change().step steps from rank 0
  /// by broadcast (joinedAt()). Blocking; collective over the generation's members. Throws
  /// InvalidArgument for a null context or options it refuses, and what the communication
  /// throws.
  ElasticEngine(std::shared_ptr<parallel::ElasticContext> context, parallel::ModelFactory model,
                parallel::OptimizerFactory optimizer, ElasticEngineOptions options = {});
  ~ElasticEngine() override;
  ElasticEngine(const ElasticEngine&) = delete;
  ElasticEngine& operator=(const ElasticEngine&) = delete;

  double step(const data::Batch& batch, double lr) override;
  /// As DataParallelEngine's, kept for every later generation.
  void setAccumulate(int microBatches) override;
  /// train::evaluate on every member alone, over the whole `dataset` (no collective, so
  /// that a member lost meanwhile cannot fail it outside a step). Leaves the model in
  /// training mode. Blocking; local.
  EvaluateResult evaluate(const data::Dataset& dataset, EvaluateOptions options = {}) override;
  DataShard dataShard() const override;
  nn::Module& model() override;
  double lr() const override;
  /// The current generation's communicator; null once the job fell below its minimum.
  std::shared_ptr<comm::Communicator> communicator() const override;
  /// The rank among the current members; after the job fell below its minimum, 0 on the
  /// first remaining member (the one that saves the state) and 1 on the others.
  int rank() const override;
  std::string name() const override;
  int replicas() const override;
  std::string algorithm() const override;
  /// DataParallelEngine's fields and world_size, min_ranks, max_ranks, generation.
  observe::Fields describe() const override;
  const parallel::Reducer* reducer() const override;
  parallel::Balancer* balancer() override;
  ElasticEngine* elastic() override { return this; }
  /// DataParallelEngine's state (weights, optimizer state, "strategy", "replicas": the
  /// members). Blocking; collective over the members (nothing to gather once the job fell
  /// below its minimum).
  StateDict stateDict() override;
  /// As DataParallelEngine's; the loaded state is committed as the state after the step fit
  /// resumes from (fit commits it). Blocking; collective.
  void loadStateDict(const StateDict& state) override;

  /// The steps the job had done when this process was admitted (it continues from there);
  /// nullopt for a rank that started with the job.
  std::optional<int64_t> joinedAt() const;
  /// Horovod's commit: the state now held is the state after `stepsDone` steps, the one to
  /// come back to when a later step fails (the engine keeps it and the one before). Call it
  /// after every completed step and once before the first. Local; no communication.
  void commit(int64_t stepsDone);
  /// At a step boundary (before step `stepsDone`): when a joiner waits (an all-reduce over
  /// the members), admits it into the next generation and hands it the state; returns the
  /// steps done to continue from (as `stepsDone`), nullopt when nobody waits. Blocking;
  /// collective over the members. Throws what the agreement throws (PeerError, Timeout:
  /// give it to recover()).
  std::optional<int64_t> admitJoiners(int64_t stepsDone);
  /// After `error` ended a step or a collective of the loop around it, with `stepsDone`
  /// steps committed: for a PeerError or Timeout (a member died or stopped answering) the
  /// survivors regroup (the caller first drops every reference to communicator()), go back
  /// to the state after the last step every member completed and admit waiting joiners;
  /// returns that step. nullopt for any other error (the caller rethrows it). Blocking;
  /// collective over the survivors. Throws parallel::BelowMinRanksError when fewer than the
  /// minimum are left: the engine then holds the state after its change().step on this
  /// process alone (rank() 0 on the first member), for a checkpoint before stopping.
  std::optional<int64_t> recover(const Error& error, int64_t stepsDone);
  /// Training ended: ranks still waiting to join stop waiting. Called by rank 0.
  void finish(const std::string& why = "training finished");
  /// The membership events since the last call (every member returns them; rank 0 writes).
  std::vector<ElasticEvent> takeEvents();
  /// world_size and generation, for metrics lines.
  observe::Fields membershipFields() const;
  /// The membership underneath.
  parallel::ElasticContext& context();

 private:
  struct Snapshot {
    int64_t step = -1;
    NamedTensors weights;
    optim::StateDict optimizer;
  };
  using Clock = std::chrono::steady_clock;

  std::unique_ptr<DataParallelEngine> build(std::shared_ptr<comm::Communicator> comm) const;
  Snapshot take(int64_t step);
  const Snapshot* snapshotAfter(int64_t step) const;
  void adopt(const Snapshot* from, int64_t agreedStep);
  int64_t changeMembership(int64_t stepsDone, const std::string& reason);
  void keepForStopping(const parallel::MembershipChange& change);
  void reportChange(const parallel::MembershipChange& change);
  observe::Logger& logger();

  std::shared_ptr<parallel::ElasticContext> context_;
  parallel::ModelFactory modelFactory_;
  parallel::OptimizerFactory optimizerFactory_;
  ElasticEngineOptions options_;
  std::unique_ptr<observe::Logger> stderrLogger_;
  std::unique_ptr<DataParallelEngine> engine_;  // the current generation's
  int accumulate_ = 1;  // micro-batches per step of every generation
  Snapshot before_, last_;  // the states after before_.step and last_.step steps
  std::optional<int64_t> joinedAt_;
  std::chrono::milliseconds deadline_{0};  // generation 0's detection deadline, once restored
  std::optional<int64_t> firstCommit_;
  std::optional<Clock::time_point> failedAt_;  // since a failed step, until the next completes
  std::vector<ElasticEvent> events_;
  bool stopped_ = false;  // below the minimum: engine_ is one process's
  int stoppedRank_ = 0;
  int stoppedMembers_ = 0;
};

}  // namespace kolo::train
