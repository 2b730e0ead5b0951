// ElasticContext: generations of membership agreed through the store. Generation G+1 is
// decided by the first survivor whose view is complete (every member of G has reported
// under G+1 or is marked lost, or the wait ran out): it takes the leader counter of G+1 and
// writes the members and their common step; the others read that record. A rank missing
// from the record was too late and is refused.
#include "kolo/parallel/elastic.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/settings.h"

namespace kolo::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string joinIds(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) {
    if (!text.empty()) text += ", ";
    text += std::to_string(id);
  }
  return text.empty() ? "none" : text;
}

}  // namespace

std::string elasticLostKey(int id, const std::string& prefix) {
  return prefix + "/lost/" + std::to_string(id);
}

ElasticContext::ElasticContext(std::shared_ptr<comm::Store> store, int id, int size,
                               ElasticOptions options)
    : store_(std::move(store)), id_(id), options_(std::move(options)) {
  KOLO_REQUIRE(store_ != nullptr, "ElasticContext: no store");
  KOLO_REQUIRE(size >= 1 && id >= 0 && id < size, "ElasticContext: rank ", id, " of world size ",
               size);
  KOLO_REQUIRE(options_.minRanks >= 1 && options_.minRanks <= size, "ElasticContext: min ranks ",
               options_.minRanks, " must be within 1..", size);
  for (int m = 0; m < size; ++m) members_.push_back(m);
  rank_ = id;
  connect();
}

ElasticContext::~ElasticContext() = default;

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
               "KOLO_RANK, KOLO_WORLD_SIZE and KOLO_STORE are set by kolo run --elastic)");
  options.minRanks = static_cast<int>(*minRanks);
  if (const std::optional<double> seconds = settings::timeout())
    options.native.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*seconds * 1000)));
  auto store = comm::connectTcpStore(address, settings::token(), options.native.timeout);
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
  std::string why = reason;
  for (;;) {
    MembershipChange change = agree(completedStep, why);
    if (options_.onAgreed) options_.onAgreed(change.generation);
    try {
      connect();
    } catch (const Error& e) {
      if (!dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const Timeout*>(&e)) throw;
      // A member failed during the change: the survivors form the next generation.
      comm_.reset();
      why = "the rendezvous of generation " + std::to_string(generation_) + " failed: " + e.what();
      completedStep = change.step;
      continue;
    }
    change.lost.clear();
    for (int m : before)
      if (std::find(members_.begin(), members_.end(), m) == members_.end()) change.lost.push_back(m);
    return change;
  }
}

MembershipChange ElasticContext::agree(int64_t completedStep, const std::string& reason) {
  const int64_t next = generation_ + 1;
  const std::string at = options_.prefix + "/g" + std::to_string(next);
  // A generation formed after this rank's (it missed one): refused at once.
  const int64_t current = store_->add(options_.prefix + "/generation", 0);
  if (current > generation_)
    KOLO_THROW(PeerError, "elastic rank ", id_, ": generation ", current,
               " was formed without it (it is still in generation ", generation_, ")");
  store_->setString(at + "/in/" + std::to_string(id_), std::to_string(completedStep));
  // Wait until every member of this generation has reported or is known to be lost.
  const auto deadline = Clock::now() + 2 * options_.native.timeout + std::chrono::seconds(1);
  std::vector<int> pending = members_;
  while (!pending.empty() && Clock::now() < deadline &&
         !store_->check({at + "/members"})) {
    std::vector<int> still;
    for (int m : pending)
      if (!store_->check({at + "/in/" + std::to_string(m)}) &&
          !store_->check({elasticLostKey(m, options_.prefix)}))
        still.push_back(m);
    pending.swap(still);
    if (!pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (store_->add(at + "/leader", 1) == 1) {
    // This rank decides: the members are those that reported; the step is their least.
    int64_t step = completedStep;
    std::string record;
    std::vector<int> chosen;
    for (int m : members_) {
      const std::string key = at + "/in/" + std::to_string(m);
      if (!store_->check({key})) continue;
      step = std::min<int64_t>(step, std::stoll(store_->getString(key, options_.native.timeout)));
      chosen.push_back(m);
    }
    for (int m : chosen) {
      record += ' ';
      record += std::to_string(m);
    }
    store_->setString(at + "/members", std::to_string(step) + record);
    store_->add(options_.prefix + "/generation", 1);
  }
  const std::string record =
      store_->getString(at + "/members", 2 * options_.native.timeout + std::chrono::seconds(1));
  std::istringstream in(record);
  MembershipChange change;
  change.generation = next;
  in >> change.step;
  for (int m; in >> m;) change.members.push_back(m);
  for (int m : members_)
    if (std::find(change.members.begin(), change.members.end(), m) == change.members.end())
      change.lost.push_back(m);
  const auto me = std::find(change.members.begin(), change.members.end(), id_);
  if (me == change.members.end())
    KOLO_THROW(PeerError, "elastic rank ", id_, ": generation ", next,
               " was formed without it (it came back late, still in generation ", generation_,
               ")");
  if (static_cast<int>(change.members.size()) < options_.minRanks)
    throw BelowMinRanksError(
        detail::concat("elastic job: ", change.members.size(), " rank(s) left after losing rank(s) ",
                       joinIds(change.lost), " (", reason, "), below --min-ranks ", options_.minRanks,
                       "; stopping"),
        change);
  generation_ = next;
  members_ = change.members;
  rank_ = static_cast<int>(me - change.members.begin());
  return change;
}

}  // namespace kolo::parallel
