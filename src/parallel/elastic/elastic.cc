// ElasticContext: generations of membership agreed through the store. Generation G+1 is
// decided by the first survivor whose view is complete (every member of G has reported
// under G+1 or is marked lost, or the wait ran out): it takes the leader counter of G+1 and
// writes the members and their common step; the others read that record. A rank missing
// from the record was too late and is refused. Joiners take a ticket from a counter and
// name themselves under it; the decider admits the tickets not yet decided on (up to
// maxRanks members), and the record says how many tickets are decided.
#include "parallel/elastic/store_keys.h"
#include "kolo/parallel/elastic.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <thread>

#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/settings.h"
#include "parallel/elastic/membership.h"
#include "parallel/elastic/record.h"

namespace kolo::parallel {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::vector<int>& ids, int id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::string elasticLostKey(int id, const std::string& prefix) {
  return prefix + "/lost/" + std::to_string(id);
}

std::string elasticFinishedKey(const std::string& prefix) { return prefix + "/finished"; }

std::string elasticAdmittedKey(int id, const std::string& prefix) {
  return prefix + "/admitted/" + std::to_string(id);
}

ElasticContext::ElasticContext(std::shared_ptr<comm::Store> store, int id, int size,
                               ElasticOptions options)
    : store_(std::move(store)), id_(id), options_(std::move(options)) {
  KOLO_REQUIRE(store_ != nullptr, "ElasticContext: no store");
  KOLO_REQUIRE(size >= 1 && id >= 0 && id < size, "ElasticContext: rank ", id, " of world size ",
               size);
  KOLO_REQUIRE(options_.minRanks >= 1 && options_.minRanks <= size, "ElasticContext: min ranks ",
               options_.minRanks, " must be within 1..", size);
  if (options_.maxRanks == 0) options_.maxRanks = size;
  KOLO_REQUIRE(options_.maxRanks >= size, "ElasticContext: max ranks ", options_.maxRanks,
               " is below the ", size, " launched ranks");
  for (int m = 0; m < size; ++m) members_.push_back(m);
  rank_ = id;
  connect();
}

ElasticContext::ElasticContext(std::shared_ptr<comm::Store> store, int id, ElasticOptions options)
    : store_(std::move(store)), id_(id), options_(std::move(options)) {}

ElasticContext::~ElasticContext() = default;

std::unique_ptr<ElasticContext> ElasticContext::join(std::shared_ptr<comm::Store> store, int id,
                                                     ElasticOptions options) {
  KOLO_REQUIRE(store != nullptr, "ElasticContext::join: no store");
  KOLO_REQUIRE(id >= 0 && options.minRanks >= 1 && options.maxRanks >= options.minRanks,
               "ElasticContext::join: rank ", id, " with min ranks ", options.minRanks,
               " and max ranks ", options.maxRanks);
  std::unique_ptr<ElasticContext> self(new ElasticContext(std::move(store), id, std::move(options)));
  comm::Store& kv = *self->store_;
  const int64_t ticket = kv.add(self->key("joiners"), 1);
  kv.setString(self->key("joiner/" + std::to_string(ticket)), std::to_string(id));
  // Wait for the newest generation to name this rank; one formed after it without this
  // rank means it was dropped (it came too late to the rendezvous).
  const auto deadline = Clock::now() + self->options_.rendezvousTimeout;
  int64_t seen = 0, admittedIn = 0;
  detail::ElasticRecord admitted;
  for (;;) {
    if (kv.check({elasticFinishedKey(self->options_.prefix)})) return nullptr;
    const int64_t current = kv.add(self->key("generation"), 0);
    for (; seen < current; ++seen) {
      std::string at = "g";  // (built in steps: GCC 12 warns falsely on "g" + to_string)
      at += std::to_string(seen + 1);
      at += "/members";
      detail::ElasticRecord record = detail::parseElasticRecord(
          kv.getString(self->key(at), self->options_.native.timeout), at);
      if (contains(record.members, id)) {
        admitted = std::move(record);
        admittedIn = seen + 1;
      }
    }
    if (admittedIn > 0 && admittedIn < current)
      KOLO_THROW(PeerError, "elastic rank ", id, ": admitted into generation ", admittedIn,
                 " but generation ", current, " was formed without it");
    if (admittedIn > 0) break;
    if (Clock::now() >= deadline)
      KOLO_THROW(Timeout, "elastic rank ", id, ": no generation admitted it within ",
                 self->options_.rendezvousTimeout.count(), " ms of registering (ticket ", ticket, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  self->generation_ = admittedIn;
  self->members_ = admitted.members;
  self->rank_ = static_cast<int>(std::find(admitted.members.begin(), admitted.members.end(), id) -
                                 admitted.members.begin());
  self->admitted_ = admitted.tickets;
  kv.setString(elasticAdmittedKey(id, self->options_.prefix), std::to_string(admittedIn));
  MembershipChange change;
  change.generation = admittedIn;
  change.members = admitted.members;
  change.step = admitted.step;
  std::vector<int> others = admitted.members;  // as this rank sees it: it is the one joining
  others.erase(std::find(others.begin(), others.end(), id));
  self->establish(std::move(change), others);
  return self;
}

bool ElasticContext::launchedElastic() {
  return settings::elasticMinRanks().has_value() && settings::rank().has_value();
}

std::unique_ptr<ElasticContext> ElasticContext::fromEnvironment(ElasticOptions options) {
  const std::optional<int64_t> minRanks = settings::elasticMinRanks();
  const std::optional<int64_t> rank = settings::rank(), size = settings::worldSize();
  const std::string address = settings::store();
  if (!minRanks || !rank || !size || address.empty())
    KOLO_THROW(InvalidArgument,
               "ElasticContext::fromEnvironment: not in an elastic job (KOLO_ELASTIC_MIN_RANKS, "
               "KOLO_RANK, KOLO_WORLD_SIZE and KOLO_STORE are set by kolo's launcher of an elastic "
               "job)");
  options.minRanks = static_cast<int>(*minRanks);
  if (const std::optional<int64_t> maxRanks = settings::elasticMaxRanks())
    options.maxRanks = static_cast<int>(*maxRanks);
  if (const std::optional<double> seconds = settings::timeout())
    options.native.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*seconds * 1000)));
  auto store = comm::connectTcpStore(address, settings::token(), options.native.timeout);
  if (settings::elasticJoin()) {
    if (options.maxRanks == 0) options.maxRanks = static_cast<int>(*size);
    return join(std::move(store), static_cast<int>(*rank), std::move(options));
  }
  return std::make_unique<ElasticContext>(std::move(store), static_cast<int>(*rank),
                                          static_cast<int>(*size), std::move(options));
}

void ElasticContext::connect() {
  comm::NativeOptions native = options_.native;
  native.storePrefix = options_.prefix + "/g" + std::to_string(generation_) + "/comm";
  // Generation 0's ranks may start far apart; a later generation's are running already.
  native.timeout = generation_ == 0 ? std::max(options_.rendezvousTimeout, options_.native.timeout)
                                    : options_.native.timeout;
  comm_ = comm::createNativeCommunicator(store_, rank_, size(), native);
  comm_->setTimeout(options_.native.timeout);
}

MembershipChange ElasticContext::regroup(int64_t completedStep, const std::string& reason) {
  comm_.reset();  // peers still waiting on this rank see its communicator closed
  const std::vector<int> before = members_;
  return establish(agree(completedStep, reason), before);
}

MembershipChange ElasticContext::establish(MembershipChange change, const std::vector<int>& before) {
  for (;;) {
    if (options_.onAgreed) options_.onAgreed(change.generation);
    try {
      connect();
    } catch (const Error& e) {
      if (!dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const Timeout*>(&e)) throw;
      // A member failed during the change: the survivors form the next generation.
      comm_.reset();
      const auto began = change.firstReport;
      change = agree(change.step, "the rendezvous of generation " + std::to_string(generation_) +
                                      " failed: " + e.what());
      if (began != std::chrono::system_clock::time_point{}) change.firstReport = std::min(change.firstReport, began);
      continue;
    }
    change.lost.clear();
    change.joined.clear();
    for (int m : before)
      if (!contains(members_, m)) change.lost.push_back(m);
    for (int m : members_)
      if (!contains(before, m)) change.joined.push_back(m);
    change_ = change;
    return change;
  }
}

int64_t ElasticContext::joinersRegistered() { return store_->add(key("joiners"), 0); }

bool ElasticContext::joinerWaiting() {
  if (size() >= options_.maxRanks) return false;
  int64_t seen = joinersRegistered() > admitted_ ? 1 : 0, any = 0;
  comm_->allreduce(&seen, &any, 1, DType::I64, comm::ReduceOp::Max);
  return any > 0;
}

void ElasticContext::awaitJoiners(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (size() + (joinersRegistered() - admitted_) < options_.maxRanks) {
    if (Clock::now() >= deadline)
      KOLO_THROW(Timeout, "elastic rank ", id_, ": ", options_.maxRanks - size(),
                 " rank(s) did not register to join within ", timeout.count(), " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ElasticContext::finish(const std::string& why) {
  store_->setString(elasticFinishedKey(options_.prefix), why);
}

MembershipChange ElasticContext::agree(int64_t completedStep, const std::string& reason) {
  detail::MembershipProposal proposal;
  proposal.prefix = options_.prefix;
  proposal.id = id_;
  proposal.generation = generation_;
  proposal.members = members_;
  proposal.admitted = admitted_;
  proposal.completedStep = completedStep;
  proposal.minRanks = options_.minRanks;
  proposal.maxRanks = options_.maxRanks;
  proposal.timeout = options_.native.timeout;
  detail::MembershipAgreement agreed = detail::agreeMembership(*store_, proposal, reason);
  const MembershipChange& change = agreed.change;
  generation_ = change.generation;
  members_ = change.members;
  rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), id_) - members_.begin());
  admitted_ = agreed.tickets;
  return change;
}

}  // namespace kolo::parallel
