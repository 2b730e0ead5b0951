// ElasticEngine: a DataParallelEngine per generation of an elastic job's members, the state
// after the last two completed steps kept in memory (commit), and the membership changes:
// after a failed step the survivors regroup and go back to the state after the step every
// member completed (recover); at a step boundary waiting joiners are admitted (admitJoiners);
// either way the new generation takes rank 0's state by broadcast, which is how a joiner
// receives it.
#include "kolo/train/elastic.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "kolo/parallel/distributed.h"

namespace kolo::train {
namespace {

using parallel::StrategyKind;

std::string idList(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) {
    if (!text.empty()) text += ',';
    text += std::to_string(id);
  }
  return text;
}

bool isMembershipFailure(const Error& error) {
  return dynamic_cast<const PeerError*>(&error) != nullptr ||
         dynamic_cast<const Timeout*>(&error) != nullptr;
}

}  // namespace

ElasticEngine::ElasticEngine(std::shared_ptr<parallel::ElasticContext> context,
                             parallel::ModelFactory model, parallel::OptimizerFactory optimizer,
                             ElasticEngineOptions options)
    : context_(std::move(context)),
      modelFactory_(std::move(model)),
      optimizerFactory_(std::move(optimizer)),
      options_(std::move(options)) {
  KOLO_REQUIRE(context_ != nullptr,
               "ElasticEngine: no elastic context (ElasticContext::fromEnvironment gives one in a job "
               "of kolo's launcher of an elastic job)");
  const DataParallelOptions& dp = options_.dataParallel;
  KOLO_REQUIRE(dp.strategy.kind == StrategyKind::MultiWorkerMirrored,
               "ElasticEngine: elastic training is multi-worker-mirrored, not ",
               parallel::strategyKindName(dp.strategy.kind));
  KOLO_REQUIRE(dp.clipNorm == 0.0 && !dp.commHook,
               "ElasticEngine: DataParallelOptions::clipNorm and commHook are not available in an "
               "elastic job");
  if (!options_.logger) stderrLogger_ = std::make_unique<observe::Logger>(stderr);
  const parallel::MembershipChange& admitted = context_->change();
  if (std::find(admitted.joined.begin(), admitted.joined.end(), context_->id()) != admitted.joined.end()) {
    // A joiner: the members are in the same change, handing over the state after
    // admitted.step steps.
    adopt(nullptr, admitted.step);
    joinedAt_ = last_.step;
    logger().info("elastic: joined", {{"rank", context_->id()},
                                      {"generation", context_->generation()},
                                      {"world_size", context_->size()},
                                      {"step", last_.step}});
    return;
  }
  engine_ = build(context_->communicator());
  // Generation 0's setup and first step may be slow on a loaded machine (rings are made on
  // first use): they get the rendezvous's time; the detection deadline applies after them.
  const std::shared_ptr<comm::Communicator>& comm = context_->communicator();
  deadline_ = comm->timeout();
  comm->setTimeout(std::max<std::chrono::milliseconds>(deadline_, std::chrono::minutes(5)));
}

ElasticEngine::~ElasticEngine() = default;

observe::Logger& ElasticEngine::logger() {
  return options_.logger ? *options_.logger : *stderrLogger_;
}

std::unique_ptr<DataParallelEngine> ElasticEngine::build(std::shared_ptr<comm::Communicator> comm) const {
  DataParallelOptions options = options_.dataParallel;
  if (comm) {
    options.strategy.communicator = std::move(comm);
    // A failed step must leave every member's state whole: no update sharded across ranks,
    // and the all-reduce after backward.
    options.strategy.reducer.overlap = false;
    options.strategy.reducer.shardOptimizer = false;
  } else {
    // This process alone (the job fell below its minimum): the state to save.
    options.strategy.kind = StrategyKind::OneDevice;
    options.strategy.communicator = nullptr;
    options.balanceBatch = 0;
  }
  auto engine = std::make_unique<DataParallelEngine>(modelFactory_, optimizerFactory_, std::move(options));
  engine->setAccumulate(accumulate_);
  return engine;
}

ElasticEngine::Snapshot ElasticEngine::take(int64_t step) {
  Snapshot snapshot;
  snapshot.step = step;
  for (auto& [name, tensor] : engine_->model().stateDict()) snapshot.weights.emplace_back(name, tensor.clone());
  snapshot.optimizer = engine_->optimizer().stateDict();
  return snapshot;
}

const ElasticEngine::Snapshot* ElasticEngine::snapshotAfter(int64_t step) const {
  if (step == last_.step) return &last_;
  if (step == before_.step) return &before_;
  return nullptr;
}

void ElasticEngine::adopt(const Snapshot* from, int64_t agreedStep) {
  engine_ = build(context_->communicator());
  if (from) {
    engine_->model().loadStateDict(from->weights, "the elastic snapshot");
    engine_->optimizer().loadStateDict(parallel::conformStateShapes(from->optimizer, engine_->optimizer()));
  }
  // Every member (a joiner included) takes rank 0's weights, optimizer state and step.
  engine_->strategy().syncReplicas();
  int64_t rootStep = agreedStep;
  context_->communicator()->broadcast(&rootStep, 1, DType::I64, 0);
  last_ = take(rootStep);
  before_ = Snapshot{};
}

int64_t ElasticEngine::changeMembership(int64_t stepsDone, const std::string& reason) {
  engine_.reset();  // its communicator must close before the agreement (see regroup)
  for (std::string why = reason;;) {
    parallel::MembershipChange change;
    try {
      change = context_->regroup(stepsDone, why);
    } catch (const parallel::BelowMinRanksError& stop) {
      keepForStopping(stop.change());
      throw;
    }
    if (failedAt_ && change.firstReport != std::chrono::system_clock::time_point{}) {
      // A member that saw the loss before this rank did (this rank may have waited on a
      // live peer meanwhile): the recovery counts from there.
      const auto earlier = std::chrono::system_clock::now() - change.firstReport;
      failedAt_ = std::min(*failedAt_, Clock::now() - std::chrono::duration_cast<Clock::duration>(earlier));
    }
    const Snapshot* from = snapshotAfter(change.step);
    KOLO_CHECK(from != nullptr, "elastic rank ", context_->id(), ": the members agreed on step ",
               change.step, " but this rank holds the states after steps ", before_.step, " and ",
               last_.step);
    try {
      adopt(from, change.step);
      reportChange(change);
      return last_.step;
    } catch (const Error& e) {
      // A member failed (or timed out) while the state was handed over: agree again; this
      // rank's snapshots are as they were.
      if (!isMembershipFailure(e)) throw;
      logger().warn("elastic: handing over the state failed, regrouping",
                    {{"rank", context_->id()}, {"error", e.what()}});
      engine_.reset();
      why = e.what();
    }
  }
}

void ElasticEngine::keepForStopping(const parallel::MembershipChange& change) {
  stopped_ = true;
  stoppedMembers_ = static_cast<int>(change.members.size());
  stoppedRank_ = !change.members.empty() && change.members.front() == context_->id() ? 0 : 1;
  if (stoppedRank_ != 0) return;
  const Snapshot* from = snapshotAfter(change.step);
  KOLO_CHECK(from != nullptr, "elastic rank ", context_->id(), ": no state after step ", change.step,
             " to keep (it holds steps ", before_.step, " and ", last_.step, ")");
  engine_ = build(nullptr);
  engine_->model().loadStateDict(from->weights, "the elastic snapshot");
  engine_->optimizer().loadStateDict(parallel::conformStateShapes(from->optimizer, engine_->optimizer()));
}

void ElasticEngine::reportChange(const parallel::MembershipChange& change) {
  const int64_t step = last_.step;
  if (context_->rank() == 0)
    logger().warn("elastic: membership changed", {{"generation", change.generation},
                                                  {"lost_ranks", idList(change.lost)},
                                                  {"joined_ranks", idList(change.joined)},
                                                  {"world_size", context_->size()},
                                                  {"members", idList(change.members)},
                                                  {"step", step}});
  if (!change.lost.empty())
    events_.push_back({"membership", step, {{"generation", change.generation},
                                            {"world_size", context_->size()},
                                            {"lost", idList(change.lost)}}});
  if (!change.joined.empty())
    events_.push_back({"joined", step, {{"generation", change.generation},
                                        {"world_size", context_->size()},
                                        {"joined", idList(change.joined)}}});
}

void ElasticEngine::commit(int64_t stepsDone) {
  KOLO_CHECK(engine_ != nullptr && !stopped_, "ElasticEngine::commit after the job stopped");
  if (!firstCommit_) {
    firstCommit_ = stepsDone;
  } else if (deadline_.count() > 0 && stepsDone > *firstCommit_) {
    context_->communicator()->setTimeout(deadline_);
    deadline_ = std::chrono::milliseconds(0);
  }
  if (stepsDone == last_.step) return;  // adopted or committed already
  before_ = std::move(last_);
  last_ = take(stepsDone);
  if (!failedAt_) return;
  observe::Fields fields{{"generation", context_->generation()},
                         {"world_size", context_->size()},
                         {"recovery_s", std::chrono::duration<double>(Clock::now() - *failedAt_).count()}};
  failedAt_.reset();
  if (options_.onRecovered) options_.onRecovered(fields);
  if (context_->rank() == 0) logger().info("elastic: recovered", observe::Fields{{"step", stepsDone}}.update(fields));
  events_.push_back({"recovered", stepsDone, std::move(fields)});
}

std::optional<int64_t> ElasticEngine::admitJoiners(int64_t stepsDone) {
  if (!context_->joinerWaiting()) return std::nullopt;
  return changeMembership(stepsDone, "rank(s) waiting to join");
}

std::optional<int64_t> ElasticEngine::recover(const Error& error, int64_t stepsDone) {
  if (stopped_ || !isMembershipFailure(error)) return std::nullopt;
  failedAt_ = Clock::now();
  logger().warn("elastic: step failed, regrouping", {{"rank", context_->id()},
                                                     {"step", stepsDone},
                                                     {"generation", context_->generation()},
                                                     {"error", error.what()}});
  return changeMembership(stepsDone, error.what());
}

void ElasticEngine::finish(const std::string& why) { context_->finish(why); }

std::vector<ElasticEvent> ElasticEngine::takeEvents() { return std::exchange(events_, {}); }

observe::Fields ElasticEngine::membershipFields() const {
  return {{"world_size", context_->size()}, {"generation", context_->generation()}};
}

parallel::ElasticContext& ElasticEngine::context() { return *context_; }
std::optional<int64_t> ElasticEngine::joinedAt() const { return joinedAt_; }

double ElasticEngine::step(const data::Batch& batch, double lr) {
  KOLO_CHECK(engine_ != nullptr && !stopped_, "ElasticEngine::step without a generation");
  return engine_->step(batch, lr);
}

void ElasticEngine::setAccumulate(int microBatches) {
  if (engine_) engine_->setAccumulate(microBatches);
  accumulate_ = microBatches;
}

EvaluateResult ElasticEngine::evaluate(const data::Dataset& dataset, EvaluateOptions options) {
  KOLO_CHECK(engine_ != nullptr, "ElasticEngine::evaluate without a generation");
  // Every member alone over the whole set: no collective that a member lost meanwhile
  // could fail outside a step.
  options.communicator = nullptr;
  const EvaluateResult result = train::evaluate(model(), dataset, options);
  model().train(true);
  return result;
}

DataShard ElasticEngine::dataShard() const {
  KOLO_CHECK(engine_ != nullptr, "ElasticEngine::dataShard without a generation");
  return engine_->dataShard();
}

nn::Module& ElasticEngine::model() {
  KOLO_CHECK(engine_ != nullptr, "ElasticEngine::model without a generation");
  return engine_->model();
}

double ElasticEngine::lr() const { return engine_ ? engine_->lr() : 0.0; }

std::shared_ptr<comm::Communicator> ElasticEngine::communicator() const {
  return stopped_ ? nullptr : context_->communicator();
}

int ElasticEngine::rank() const { return stopped_ ? stoppedRank_ : context_->rank(); }

std::string ElasticEngine::name() const { return parallel::strategyKindName(StrategyKind::MultiWorkerMirrored); }

int ElasticEngine::replicas() const { return stopped_ ? stoppedMembers_ : context_->size(); }

std::string ElasticEngine::algorithm() const {
  return comm::algorithmName(options_.dataParallel.strategy.reducer.collective.algorithm);
}

observe::Fields ElasticEngine::describe() const {
  observe::Fields fields = engine_ ? engine_->describe() : observe::Fields{};
  return fields.update({{"world_size", context_->size()},
                        {"min_ranks", context_->minRanks()},
                        {"max_ranks", context_->maxRanks()},
                        {"generation", context_->generation()}});
}

const parallel::Reducer* ElasticEngine::reducer() const { return engine_ ? engine_->reducer() : nullptr; }
parallel::Balancer* ElasticEngine::balancer() { return engine_ ? engine_->balancer() : nullptr; }

StateDict ElasticEngine::stateDict() {
  KOLO_CHECK(engine_ != nullptr, "ElasticEngine::stateDict without a generation");
  StateDict state = engine_->stateDict();
  if (!state.metadata.empty()) {
    state.metadata["strategy"] = name();
    state.metadata["replicas"] = std::to_string(replicas());
  }
  return state;
}

void ElasticEngine::loadStateDict(const StateDict& state) {
  KOLO_CHECK(engine_ != nullptr && !stopped_, "ElasticEngine::loadStateDict without a generation");
  engine_->loadStateDict(state);
  last_ = Snapshot{};  // the loaded state is committed next
  before_ = Snapshot{};
}

}  // namespace kolo::train
