// `kolo train`'s one table of the flags that only some strategies accept: a flag given where
// its strategy does not use it is refused before anything starts, naming the flag and the
// strategies it applies to; `kolo train --help` prints the same table.
#pragma once

#include <string>

#include "cli/train_loop.h"

namespace kolo::cli {

/// The strategy a run trains with, as the table names it: --strategy, or pipeline / tensor as
/// --mesh sets them.
std::string effectiveStrategy(const TrainConfig& config);

/// Throws InvalidArgument naming the first given flag (config.givenFlags) that the run's
/// strategy (or model) does not accept, and the strategies that do.
void checkFlagScopes(const TrainConfig& config);

/// The table as text, for `kolo train --help`.
std::string flagScopesText();

}  // namespace kolo::cli
