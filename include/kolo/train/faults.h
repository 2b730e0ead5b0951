// Faults a run injects into itself on purpose, to test what a job does when a rank dies,
// hangs, fails, is slow, or computes a NaN or a weight its replicas do not share: a plan of
// which rank strikes before which step, and fit's callbacks that carry it out. kolo's own
// fault tests drive `kolo train` through these (its --fail-at-step and --debug-* flags);
// a program of one's own tests its recovery the same way.
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "kolo/numerics.h"
#include "kolo/train/fit.h"

namespace kolo::train {

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

  Kill kill{};
  Fail fail{};
  Slow slow{};
  Nan nan{};
  Perturb perturb{};

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

}  // namespace kolo::train
