// Dissemination barrier over Links (Hensgen, Finkel & Manber): ceil(log2 n) rounds.
#pragma once

#include "comm/links.h"

namespace kolo::comm::detail {

/// Returns on every rank only after every rank has entered. Round k: send a one-byte token
/// to rank + 2^k and wait for the one from rank - 2^k.
void disseminationBarrier(Links& links);

}  // namespace kolo::comm::detail
