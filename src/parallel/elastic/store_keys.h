// The store keys of an elastic job: the protocol between its members and kolo run's elastic
// agent, private to kolo (defined in elastic.cc).
#pragma once

#include <string>

namespace kolo::parallel {

/// The key under which the launcher (or anyone who knows) marks launch rank `id` as lost,
/// so that the survivors need not wait for it.
std::string elasticLostKey(int id, const std::string& prefix = "kolo-elastic");
/// The key a member writes when the job is over (finish(): training ended, or fewer than
/// minRanks members are left), with the reason.
std::string elasticFinishedKey(const std::string& prefix = "kolo-elastic");
/// The key a joiner `id` writes once a generation admitted it (the launcher counts it as a
/// member from then on).
std::string elasticAdmittedKey(int id, const std::string& prefix = "kolo-elastic");

}  // namespace kolo::parallel
