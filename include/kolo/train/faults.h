// Faults a run injects into itself on purpose, to test what a job does when a rank dies,
// hangs, fails, is slow, or computes a NaN or a weight its replicas do not share: a plan of
// which rank strikes before which step, and fit's callbacks that carry it out. kolo's own
// fault tests drive `kolo train` through these (its --fail-at-step and --debug-* flags);
// a program of one's own tests its recovery the same way.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/numerics.h"
#include "kolo/train/fit.h"

namespace kolo::comm {
class Store;
}

namespace kolo::train {

class ElasticEngine;

struct FaultPlan {
  /// These ranks raise `signal` before step `step` (-1: none): SIGKILL for a rank that dies,
  /// SIGSTOP for one that hangs with its sockets open. Output is flushed first.
  struct Kill {
    std::vector<int> ranks{};
    int64_t step = -1;
    int signal = SIGKILL;
  };
  /// Rank `rank` throws kolo::Error "rank R: failure injected before step S" (-1: none).
  struct Fail {
    int rank = 0;
    int64_t step = -1;
  };
  /// Rank `rank` takes `factor` times its compute per step, sleeping the difference before
  /// each step, as a host that many times slower would (-1: none).
  struct Slow {
    int rank = -1;
    double factor = 1.0;
  };
  /// A NaN written into module `module`'s output (with `gradient`: into the gradient of its
  /// output) on rank `rank` at step `step`, which an observe::AnomalyDetector must name
  /// (-1: none). `module` is the detector's name of it ("2", "1.attn").
  struct Nan {
    int rank = 0;
    int64_t step = -1;
    std::string module{};
    bool gradient = false;
  };
  /// 1e-3 added to the first element of weight `tensor` on rank `rank` before step `step`:
  /// replicas out of sync, which FitOptions::checkSyncEvery must name (-1: none).
  struct Perturb {
    int rank = 0;
    int64_t step = -1;
    std::string tensor{};
  };

  /// Faults of an elastic job (ElasticEngine), whose ranks are the members' ids.
  struct Elastic {
    /// This member SIGKILLs itself once the members agreed on a new generation, before its
    /// communicator is built (-1: none).
    int killInRegroup = -1;
    /// Before this step the members wait, up to 5 minutes, for ranks registering to join
    /// while fewer than the most members run (-1: none).
    int64_t awaitJoinAt = -1;
    /// Non-empty: each member writes PATH.rank-ID, a "pid P" line, then for each step it
    /// completes "GENERATION STEP ID...", the ids of the samples it trained on.
    std::string sampleLog{};
  };
  Kill kill{};
  Fail fail{};
  Slow slow{};
  Nan nan{};
  Perturb perturb{};
  Elastic elastic{};

  /// The text forms (`kolo train`'s flags): "RANK[,RANK...]:STEP[:KILL|:STOP]", "STEP[:RANK]",
  /// "RANK:FACTOR", "STEP:RANK:MODULE[:grad]" and "STEP:RANK:TENSOR". Each throws
  /// InvalidArgument naming `what` (e.g. the flag), the text and the form.
  static Kill parseKill(const std::string& text, const std::string& what);
  static Fail parseFail(const std::string& text, const std::string& what);
  static Slow parseSlow(const std::string& text, const std::string& what);
  static Nan parseNan(const std::string& text, const std::string& what);
  static Perturb parsePerturb(const std::string& text, const std::string& what);

  /// The kill and the failure meant for `rank` before `step`: raises the signal or throws
  /// ("rank R: failure injected before <unit> S"). For loops of one's own (a parameter-server
  /// worker's pushes, a federated client host's rounds); fit's are injectFaults'.
  void strike(int rank, int64_t step, const char* unit = "step") const;
};

/// fit's callbacks carrying out `plan` on this process, rank `rank` of the engine: before each
/// step the perturbation, the kill, the failure and the slow rank's sleep, then `inner`'s
/// onStepBegin; after it the slow rank's compute is recorded before `inner`'s onStepEnd; the
/// other callbacks are `inner`'s. `model`: the engine's model (for plan.perturb); `detector`:
/// FitOptions::anomalyDetector (plan.nan is planted in it now). Throws InvalidArgument when
/// plan.perturb names a tensor the model does not have (listing those it has) or plan.nan has
/// no detector.
FitCallbacks injectFaults(const FaultPlan& plan, int rank, FitCallbacks inner = {}, nn::Module* model = nullptr,
                          observe::AnomalyDetector* detector = nullptr);

/// plan.elastic.killInRegroup on the member `id` (its launch rank) as
/// parallel::ElasticOptions::onAgreed; null for the others.
std::function<void(int64_t generation)> killInRegroup(const FaultPlan& plan, int id);

/// fit's callbacks carrying out `plan` on a member of an elastic job: injectFaults' faults by
/// the members' ids, a kill first recording its moment in the job's store (sinceKillField),
/// before a step plan.elastic's wait for joiners, after it the sample log; then `inner`'s.
/// Throws InvalidArgument when the sample log cannot be written.
FitCallbacks injectElasticFaults(const FaultPlan& plan, ElasticEngine& engine, FitCallbacks inner = {});

/// ElasticEngineOptions::onRecovered adding "since_kill_s", the seconds from the moment a kill
/// of injectElasticFaults recorded in the job's `store` (ElasticContext::store()) to now;
/// nothing when none was recorded.
std::function<void(observe::Fields&)> sinceKillField(std::shared_ptr<comm::Store> store);

}  // namespace kolo::train
