// agreeMembership (membership.h): the members of generation G+1 are decided by the first
// survivor to report under G+1 (it takes the leader counter): it waits until its view is
// complete (every member of G has reported or is marked lost, or the wait ran out) and
// writes the members and their common step twice: whole under G+1/members (for joiners) and
// as the ids that left or came under G+1/change, which the members wait for and apply to
// the members they know.
#include "parallel/elastic/membership.h"

#include <algorithm>
#include <climits>
#include <iterator>
#include <thread>

#include "kolo/error.h"
#include "parallel/elastic/record.h"
#include "parallel/elastic/store_keys.h"

namespace kolo::parallel::detail {
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

/// A generation's record as parseElasticRecord reads it: "STEP TICKETS ID...".
std::string recordText(int64_t step, int64_t tickets, const std::vector<int>& ids) {
  std::string text = std::to_string(step) + " " + std::to_string(tickets);
  for (int id : ids) {
    text += ' ';
    text += std::to_string(id);
  }
  return text;
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
  if (store.add(at + "/leader", 1) == 1) {
    // This rank decides. It waits until every member has reported or is marked lost (or
    // the wait runs out), looking at the ones still pending in one request a round, so the
    // others make no requests while they wait and the work grows with the members, not
    // with their square. The members are those that reported, the step is their least,
    // and the joiners registered since the last decision come in (while there is room and
    // the job goes on at all; one that was lost while it waited is passed over).
    const auto deadline = Clock::now() + 2 * p.timeout + std::chrono::seconds(1);
    std::vector<int> pending(p.members.begin(), p.members.end());
    std::vector<int> reported;
    for (;;) {
      std::vector<std::string> keys;
      keys.reserve(2 * pending.size());
      for (int m : pending) keys.push_back(at + "/in/" + std::to_string(m));
      for (int m : pending) keys.push_back(elasticLostKey(m, p.prefix));
      const std::vector<bool> present = store.checkEach(keys);
      std::vector<int> still;
      for (size_t i = 0; i < pending.size(); ++i) {
        if (present[i]) {
          reported.push_back(pending[i]);
        } else if (!present[pending.size() + i]) {
          still.push_back(pending[i]);
        }
      }
      pending.swap(still);
      if (pending.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::sort(reported.begin(), reported.end());
    int64_t step = p.completedStep;
    std::vector<std::string> reportKeys;
    reportKeys.reserve(reported.size());
    for (int m : reported) reportKeys.push_back(at + "/in/" + std::to_string(m));
    const std::vector<comm::Bytes> steps = store.multiGet(reportKeys, p.timeout);
    for (size_t i = 0; i < reported.size(); ++i)
      step = std::min(step, parseElasticNumber(std::string(steps[i].begin(), steps[i].end()), reportKeys[i],
                                               INT64_MIN, INT64_MAX));
    std::vector<int> chosen = reported;
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
    // The whole list for joiners, and the change (the ids that left or came) for the
    // members, so that each of them reads and parses what changed, not every member.
    std::vector<int> changed;
    std::set_symmetric_difference(p.members.begin(), p.members.end(), chosen.begin(), chosen.end(),
                                  std::back_inserter(changed));
    store.setString(at + "/members", recordText(step, tickets, chosen));
    store.setString(at + "/change", recordText(step, tickets, changed));
    store.add(p.prefix + "/generation", 1);
  }
  const std::string where = at + "/change";
  const ElasticRecord record =
      parseElasticRecord(store.getString(where, 2 * p.timeout + std::chrono::seconds(1)), where);
  std::vector<int> changed = record.members;
  std::sort(changed.begin(), changed.end());
  MembershipAgreement agreed;
  MembershipChange& change = agreed.change;
  change.generation = next;
  change.step = record.step;
  std::set_symmetric_difference(p.members.begin(), p.members.end(), changed.begin(), changed.end(),
                                std::back_inserter(change.members));
  agreed.tickets = record.tickets;
  // Both lists are ascending: linear differences, not a search per member (thousands of
  // members each doing that is what made a regroup take seconds).
  std::set_difference(p.members.begin(), p.members.end(), change.members.begin(), change.members.end(),
                      std::back_inserter(change.lost));
  std::set_difference(change.members.begin(), change.members.end(), p.members.begin(), p.members.end(),
                      std::back_inserter(change.joined));
  if (store.check({at + "/since"})) {
    const int64_t since =
        parseElasticNumber(store.getString(at + "/since", p.timeout), at + "/since", 0, INT64_MAX);
    change.firstReport = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(since)));
  }
  if (!std::binary_search(change.members.begin(), change.members.end(), p.id))
    KOLO_THROW(PeerError, "elastic rank ", p.id, ": generation ", next,
               " was formed without it (it came back late, still in generation ", p.generation,
               ")");
  if (static_cast<int>(change.members.size()) < p.minRanks) {
    const std::string what = kolo::detail::concat(
        "elastic job: ", change.members.size(), " rank(s) left after losing rank(s) ",
        joinIds(change.lost), " (", reason, "), below ElasticOptions::minRanks ", p.minRanks, "; stopping");
    store.setString(elasticFinishedKey(p.prefix), what);  // ranks waiting to join stop waiting
    throw BelowMinRanksError(what, change);
  }
  return agreed;
}

}  // namespace kolo::parallel::detail
