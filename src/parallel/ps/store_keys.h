// The store keys of a parameter-server job: the protocol between the roles and kolo run's
// --join, private to kolo (defined in roles.cc).
#pragma once

#include <string>

namespace kolo::parallel::ps {

/// The store keys under which server i and the chief publish "host:port".
std::string serverAddressKey(int server);
std::string chiefAddressKey();
/// The store key under which the chief publishes "P W" (kolo run --join reads it).
std::string shapeKey();
/// The store counter of workers that joined with kolo run --join.
std::string joinCounterKey();
/// The store key the chief sets once the job is over, before it stops the servers: a worker
/// that starts after that has nothing to do.
std::string finishedKey();
/// The store key under which worker i publishes its model's buffers (a batch norm's running
/// statistics) after each unit, and the one under which a resumed chief publishes the
/// checkpoint's buffers for every worker to start from.
std::string workerBuffersKey(int worker);
std::string startBuffersKey();

}  // namespace kolo::parallel::ps
