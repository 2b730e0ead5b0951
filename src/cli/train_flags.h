// `kolo train`'s flags, each declared once (train_flags.cc): its name, help, the TrainConfig
// member it sets, its check, and the strategies that accept it. A flag given where its
// strategy does not use it is refused before anything starts, naming the flag and the
// strategies it applies to; `kolo train --help` prints the same table.
#pragma once

#include <string>
#include <vector>

#include "cli/train_loop.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kolo::cli {

/// A flag that only some strategies accept: the strategies (--strategy values; "lm" for
/// --model lm, "elastic" for ranks of kolo run --elastic), and what a refusal adds.
struct FlagScope {
  std::string flag;
  std::vector<std::string> where;
  std::string hint;
};
using FlagScopes = std::vector<FlagScope>;

/// What the flags set: the configuration, and the words that become part of it once parsed.
struct TrainFlags {
  TrainConfig config;
  int workers = 0;  // --workers N: re-launch under kolo run -n N
  std::string failAt, slowRank, killRank, nanAt, perturb;  // the fault hooks' texts

  /// After parsing: the given flags, the fault plan and the schedule that
  /// names a pipeline schedule, into `config`. Throws InvalidArgument for a malformed hook.
  void finish(const CLI::App& app);
};

/// Registers every flag of `kolo train` on `app`, writing into `flags`; returns the scopes.
FlagScopes addTrainFlags(CLI::App* app, TrainFlags& flags);

/// The strategy a run trains with, as the table names it: --strategy, or pipeline / tensor as
/// --mesh sets them.
std::string effectiveStrategy(const TrainConfig& config);

/// Throws InvalidArgument naming the first given flag (config.givenFlags) that the run's
/// strategy (or model) does not accept, and the strategies that do.
void checkFlagScopes(const FlagScopes& scopes, const TrainConfig& config);

/// The scopes as text, for `kolo train --help`.
std::string flagScopesText(const FlagScopes& scopes);

}  // namespace kolo::cli
