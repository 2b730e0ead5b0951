// The table of flags by strategy (train_flags.h). Flags not listed here apply to every
// strategy; their values are checked where they are used.
#include "cli/train_flags.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "kolo/error.h"
#include "kolo/parallel/elastic.h"
#include "kolo/parallel/mesh.h"

namespace kolo::cli {
namespace {

struct FlagScope {
  std::vector<std::string> flags;
  // The strategies (--strategy values) that accept the flags; "lm" stands for --model lm,
  // "elastic" for ranks of kolo run --elastic.
  std::vector<std::string> where;
  // Appended to a refusal: why, or how to run the strategy.
  std::string hint{};
};

const std::vector<FlagScope>& scopes() {
  static const std::vector<FlagScope> table = {
      {{"--replicas"}, {"mirrored", "central-storage"}},
      {{"--reduction"}, {"mirrored"}},
      {{"--bucket-mb", "--first-bucket-mb", "--overlap", "--shard-optimizer"},
       {"mirrored", "multi-worker-mirrored"}},
      {{"--compress"},
       {"multi-worker-mirrored"},
       " (parameter-server workers compress with --ps-compress; kolo train --help lists the flags of "
       "each strategy)"},
      {{"--balance", "--balance-every"}, {"multi-worker-mirrored"}},
      {{"--check-sync"},
       {"multi-worker-mirrored"},
       ": it compares the weights of several ranks (under kolo run, or --workers N)"},
      {{"--debug-perturb"}, {"one-device", "mirrored", "central-storage", "multi-worker-mirrored"}},
      {{"--clip-norm"}, {"one-device", "fsdp"}},
      {{"--shard", "--shard-group", "--hsdp", "--unit-params"}, {"fsdp"}},
      {{"--detect-anomaly", "--debug-nan-at"},
       {"one-device", "mirrored", "central-storage", "multi-worker-mirrored", "fsdp"}},
      {{"--status-file"},
       {"one-device", "mirrored", "central-storage", "multi-worker-mirrored", "fsdp", "pipeline", "tensor",
        "lm"}},
      {{"--ps-mode", "--staleness", "--ps-shard-bytes", "--ps-compress", "--ps-transport",
        "--ps-heartbeat-seconds", "--ps-staleness-lr", "--ps-overlap", "--ps-lookahead",
        "--ps-unit-batches"},
       {"parameter-server"}},
      {{"--clients", "--clients-per-round", "--client-fraction", "--rounds", "--local-epochs",
        "--local-batch", "--prox-mu", "--server-lr", "--partition", "--round-timeout",
        "--debug-drop-rate", "--secure-agg", "--sa-threshold", "--dp-clip", "--dp-noise",
        "--dp-delta"},
       {"federated"}},
      {{"--stages", "--split-at"}, {"pipeline"}},
      {{"--micro-batches", "--pipeline-schedule"}, {"pipeline", "lm"}},
      {{"--recompute"},
       {"pipeline", "one-device", "mirrored", "central-storage", "multi-worker-mirrored", "fsdp"}},
      {{"--sequence-parallel"}, {"tensor", "pipeline"}},
      {{"--layers", "--d-model", "--heads", "--seq-len", "--sample-bytes"}, {"lm"}},
      {{"--debug-kill-in-regroup", "--debug-await-join", "--debug-sample-log"}, {"elastic"}},
  };
  return table;
}

std::string joined(const std::vector<std::string>& names, const std::string& last) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + names[i];
  return text;
}

// How a message names strategies: "--strategy a, b or c", "--model lm", "kolo run --elastic".
std::string described(const std::vector<std::string>& where) {
  std::vector<std::string> strategies, others;
  for (const std::string& w : where) {
    if (w == "lm")
      others.push_back("--model lm");
    else if (w == "elastic")
      others.push_back("kolo run --elastic");
    else
      strategies.push_back(w);
  }
  if (!strategies.empty()) others.insert(others.begin(), "--strategy " + joined(strategies, " or "));
  return joined(others, " or ");
}

}  // namespace

std::string effectiveStrategy(const TrainConfig& config) {
  if (config.mesh.empty()) return config.strategy;
  const parallel::MeshShape shape = parallel::parseMeshShape(config.mesh);
  return shape.pp == 1 && shape.tp > 1 ? "tensor" : "pipeline";
}

void checkFlagScopes(const TrainConfig& config) {
  std::vector<std::string> run = {effectiveStrategy(config)};
  if (config.model == "lm") run.push_back("lm");
  if (parallel::ElasticContext::launchedElastic()) run.push_back("elastic");
  for (const FlagScope& scope : scopes()) {
    const bool accepted = std::any_of(scope.where.begin(), scope.where.end(), [&](const std::string& w) {
      return std::find(run.begin(), run.end(), w) != run.end();
    });
    if (accepted) continue;
    for (const std::string& flag : scope.flags) {
      if (!config.givenFlags.count(flag)) continue;
      KOLO_THROW(InvalidArgument, flag, " applies to ", described(scope.where), ", not to ",
                 described({run.front()}),
                 scope.hint.empty() ? " (kolo train --help lists the flags of each strategy)"
                                    : scope.hint);
    }
  }
}

std::string flagScopesText() {
  std::ostringstream text;
  text << "Flags that only some strategies accept (given with another, they are refused):\n";
  for (const FlagScope& scope : scopes()) {
    std::vector<std::string> flags;
    for (const std::string& flag : scope.flags)
      if (flag.rfind("--debug-", 0) != 0) flags.push_back(flag);  // test hooks stay hidden
    if (!flags.empty())
      text << "  " << described(scope.where) << ":\n    " << joined(flags, ", ") << "\n";
  }
  return text.str();
}

}  // namespace kolo::cli
