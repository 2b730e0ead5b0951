// The store protocol by which an elastic job's survivors agree on the next generation's
// members (ElasticContext::regroup's control-plane part), as a free function so that
// `kolo bench rendezvous` runs it for thousands of simulated ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kolo/comm/store.h"
#include "kolo/parallel/elastic.h"

namespace kolo::parallel::detail {

/// One member's view when it asks for the next generation.
struct MembershipProposal {
  /// Key prefix of the job (ElasticOptions::prefix).
  std::string prefix;
  /// This member's launch rank.
  int id = 0;
  /// The generation it is in now, and its members (launch ranks, ascending; a view, so
  /// that thousands of simulated ranks can share one list).
  int64_t generation = 0;
  std::span<const int> members;
  /// Joiner tickets already decided on.
  int64_t admitted = 0;
  /// The last step this member completed.
  int64_t completedStep = 0;
  int minRanks = 1;
  int maxRanks = 1;
  /// Deadline of the store operations; the wait for the others is 2 * timeout + 1 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// What was agreed: the change and how many joiner tickets are decided after it.
struct MembershipAgreement {
  MembershipChange change;
  int64_t tickets = 0;
};

/// Collective over the surviving members of `proposal.generation`: each reports its step;
/// the first to report waits until every member reported or is marked lost and decides the
/// members of the next generation and their common step, admitting registered joiners while
/// there is room. Throws PeerError when a newer generation was formed without this member
/// or the agreed one leaves it out, BelowMinRanksError (after marking the job finished,
/// with `reason` in its message) when fewer than minRanks members are left.
MembershipAgreement agreeMembership(comm::Store& store, const MembershipProposal& proposal,
                                    const std::string& reason);

}  // namespace kolo::parallel::detail
