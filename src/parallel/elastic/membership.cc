// agreeMembership (membership.h): the members of generation G+1 are decided by the first
// survivor whose view is complete (every member of G has reported under G+1 or is marked
// lost, or the wait ran out): it takes the leader counter of G+1 and writes the members and
// their common step; the others read that record.
#include "parallel/elastic/membership.h"

#include <algorithm>
#include <climits>
#include <thread>

#include "kolo/error.h"
#include "parallel/elastic/record.h"
#include "parallel/elastic/store_keys.h"

namespace kolo::parallel::detail {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(std::span<const int> ids, int id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

std::string joinIds(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) {
    if (!text.empty()) text += ", ";
    text += std::to_string(id);
  }
  return text.empty() ? "none" : text;
}

}  // namespace

MembershipAgreement agreeMembership(comm::Store& store, const MembershipProposal& p,
                                    const std::string& reason) {
  const int64_t next = p.generation + 1;
  const std::string at = p.prefix + "/g" + std::to_string(next);
  // A generation formed after this rank's (it missed one): refused at once.
  const int64_t current = store.add(p.prefix + "/generation", 0);
  if (current > p.generation)
    KOLO_THROW(PeerError, "elastic rank ", p.id, ": generation ", current,
               " was formed without it (it is still in generation ", p.generation, ")");
  // The first member to enter the change notes the moment (about when the loss was first
  // seen): one key for all, so the store's work stays one operation per member.
  if (store.add(at + "/entered", 1) == 1) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    store.setString(at + "/since", std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
  }
  store.setString(at + "/in/" + std::to_string(p.id), std::to_string(p.completedStep));
  // Wait until every member of this generation has reported or is known to be lost.
  const auto deadline = Clock::now() + 2 * p.timeout + std::chrono::seconds(1);
  std::vector<int> pending(p.members.begin(), p.members.end());
  while (!pending.empty() && Clock::now() < deadline && !store.check({at + "/members"})) {
    std::vector<int> still;
    for (int m : pending)
      if (!store.check({at + "/in/" + std::to_string(m)}) &&
          !store.check({elasticLostKey(m, p.prefix)}))
        still.push_back(m);
    pending.swap(still);
    if (!pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (store.add(at + "/leader", 1) == 1) {
    // This rank decides: the members are those that reported, the step is their least,
    // and the joiners registered since the last decision come in (while there is room and
    // the job goes on at all; one that was lost while it waited is passed over).
    int64_t step = p.completedStep;
    std::vector<int> chosen;
    for (int m : p.members) {
      const std::string reported = at + "/in/" + std::to_string(m);
      if (!store.check({reported})) continue;
      step = std::min(step, parseElasticNumber(store.getString(reported, p.timeout), reported,
                                               INT64_MIN, INT64_MAX));
      chosen.push_back(m);
    }
    int64_t tickets = p.admitted;
    const bool goesOn = static_cast<int>(chosen.size()) >= p.minRanks;
    for (int64_t t = p.admitted + 1, registered = store.add(p.prefix + "/joiners", 0);
         goesOn && t <= registered && static_cast<int>(chosen.size()) < p.maxRanks; ++t) {
      const std::string ticket = p.prefix + "/joiner/" + std::to_string(t);
      const int joiner = static_cast<int>(
          parseElasticNumber(store.getString(ticket, p.timeout), ticket, 0, INT_MAX));
      tickets = t;
      if (!store.check({elasticLostKey(joiner, p.prefix)})) chosen.push_back(joiner);
    }
    std::sort(chosen.begin(), chosen.end());
    std::string record = std::to_string(step) + " " + std::to_string(tickets);
    for (int m : chosen) {
      record += ' ';
      record += std::to_string(m);
    }
    store.setString(at + "/members", record);
    store.add(p.prefix + "/generation", 1);
  }
  const ElasticRecord record = parseElasticRecord(
      store.getString(at + "/members", 2 * p.timeout + std::chrono::seconds(1)), at);
  MembershipAgreement agreed;
  MembershipChange& change = agreed.change;
  change.generation = next;
  change.step = record.step;
  change.members = record.members;
  agreed.tickets = record.tickets;
  for (int m : p.members)
    if (!contains(change.members, m)) change.lost.push_back(m);
  for (int m : change.members)
    if (!contains(p.members, m)) change.joined.push_back(m);
  if (store.check({at + "/since"})) {
    const int64_t since =
        parseElasticNumber(store.getString(at + "/since", p.timeout), at + "/since", 0, INT64_MAX);
    change.firstReport = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(since)));
  }
  if (!contains(change.members, p.id))
    KOLO_THROW(PeerError, "elastic rank ", p.id, ": generation ", next,
               " was formed without it (it came back late, still in generation ", p.generation,
               ")");
  if (static_cast<int>(change.members.size()) < p.minRanks) {
    const std::string what = kolo::detail::concat(
        "elastic job: ", change.members.size(), " rank(s) left after losing rank(s) ",
        joinIds(change.lost), " (", reason, "), below --min-ranks ", p.minRanks, "; stopping");
    store.setString(elasticFinishedKey(p.prefix), what);  // ranks waiting to join stop waiting
    throw BelowMinRanksError(what, change);
  }
  return agreed;
}

}  // namespace kolo::parallel::detail
