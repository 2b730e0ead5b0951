// Numeric checks of a training run, as PyTorch's anomaly mode and DDP's replica checks: an
// AnomalyDetector that names the first module (and rank, and step) whose forward output or
// gradient holds a NaN or an infinity, and a weight-sync check that hashes every tensor of
// every rank's replica and names the ranks whose weights left the others'.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/tensor.h"

namespace kolo::observe {

/// Where a value of the checked kind was seen first in a step.
enum class AnomalyPhase : int64_t {
  ForwardOutput = 0,      // a module's output, after its forward
  OutputGradient = 1,     // the gradient of a module's output, in backward
  ParameterGradient = 2,  // a parameter's gradient, when it is final (leaf hooks)
};

/// The first non-finite tensor of a step on one rank.
struct Anomaly {
  int64_t step = -1;
  int rank = 0;
  AnomalyPhase phase = AnomalyPhase::ForwardOutput;
  std::string module;      // its name in the model ("2", "attn.qkv"); "" is the model itself
  std::string moduleType;  // the module's class ("Linear")
  std::string parameter;   // ParameterGradient: the parameter's full name ("2.weight")
  int64_t nanCount = 0;
  int64_t infCount = 0;
  int64_t firstIndex = 0;  // flat index (row-major) of the first non-finite element
  /// "rank 1, step 5: the forward output of module '2' (Linear) holds 3 NaN and 0 Inf
  /// values (the first at element 17)".
  std::string describe() const;
};

/// Options of an AnomalyDetector.
struct AnomalyOptions {
  /// Check each parameter's gradient when it is final (grad-ready hooks). Leave it off when a
  /// Reducer overlaps communication with backward: its in-place all-reduce of a bucket may
  /// run while a later hook reads the gradient.
  bool parameterGradients = true;
  /// This process's rank, reported in Anomaly::rank.
  int rank = 0;
};

/// Watches every module of a model for NaN and infinity: forward hooks check each module's
/// output, output-gradient hooks the gradient flowing into it, and (optionally) grad-ready
/// hooks each parameter's gradient. Modules are seen when called through operator() (as
/// Sequential calls its children); parameter gradients are seen however the model is
/// called. The first finding of a step is kept (later ones are counted, not kept).
///
/// Usage per step: beginStep(step); forward; backward; then throwIfFound() (one process),
/// or agree(comm) (every rank; collective). The model must outlive the detector; the
/// detector removes its hooks when destroyed. Not thread-safe: the model's forward and
/// backward run on one thread at a time.
class AnomalyDetector {
 public:
  explicit AnomalyDetector(nn::Module& model, AnomalyOptions options = {});
  ~AnomalyDetector();
  AnomalyDetector(const AnomalyDetector&) = delete;
  AnomalyDetector& operator=(const AnomalyDetector&) = delete;

  /// Starts step `step`: forgets the previous step's finding.
  void beginStep(int64_t step);
  /// The first finding of the current step on this process, if any.
  const std::optional<Anomaly>& found() const { return found_; }
  /// Throws DivergedError with found()->describe() when something was found.
  void throwIfFound() const;
  /// Collective over `comm` (every rank calls it once per step, found or not): when any rank
  /// found something, every rank throws the same DivergedError naming the lowest such rank's
  /// finding and the other ranks that found one. The names are decoded from this rank's own
  /// model, so every rank must hold the same model structure.
  void agree(comm::Communicator& comm) const;

  /// For tests of the tools that use the detector: at step `step`, write a NaN into element
  /// 0 of module `module`'s output (phase ForwardOutput) or of the gradient of its output
  /// (OutputGradient) before the check runs. Throws InvalidArgument naming the module when
  /// the model has none of that name, or for ParameterGradient.
  void injectNan(int64_t step, const std::string& module, AnomalyPhase phase);

 private:
  void inspect(const Tensor& values, size_t moduleIndex, AnomalyPhase phase,
               const std::string& parameter);

  AnomalyOptions options_;
  std::vector<std::pair<std::string, nn::Module*>> modules_;
  std::vector<std::pair<nn::Module*, int>> forwardHooks_, gradHooks_;
  std::vector<std::pair<Tensor, int>> parameterHooks_;
  std::vector<std::string> parameterNames_;
  int64_t step_ = -1;
  std::optional<Anomaly> found_;
  int64_t injectStep_ = -1;
  size_t injectModule_ = 0;
  AnomalyPhase injectPhase_ = AnomalyPhase::ForwardOutput;
};

/// Counts of non-finite elements of a floating-point tensor (any layout): NaNs, infinities
/// and the flat index of the first of either (-1 when all are finite). Integer tensors are
/// always finite.
struct NonFinite {
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t first = -1;
};
NonFinite countNonFinite(const Tensor& values);

/// A 64-bit hash of a tensor's dtype, shape and element bytes in row-major order (equal
/// tensors hash equal on every rank of one architecture; one changed bit changes it).
uint64_t tensorHash(const Tensor& values);

/// What comparing the replicas' weights found.
struct SyncReport {
  int64_t step = -1;
  int worldSize = 0;
  /// Ranks whose hash of some tensor differs from the reference (the hash held by the most
  /// ranks, ties going to the group of the lowest rank), in rank order; empty when in sync.
  std::vector<int> divergedRanks;
  /// Ranks that agree with the reference in every tensor.
  std::vector<int> agreeingRanks;
  std::string firstTensor;      // the first tensor (in the given order) where ranks disagree
  int64_t tensorsDiffering = 0;
  int64_t tensorCount = 0;
  bool inSync() const { return divergedRanks.empty(); }
  /// "weights out of sync at step 20: rank 1 differs from rank 0 in 2 of 6 tensors, the
  /// first '0.weight'".
  std::string describe() const;
};

/// Collective: every rank hashes each of `tensors` (same names and order on every rank)
/// and all-gathers the hashes (one 64-bit value per tensor); every rank gets the same
/// report. Throws InvalidArgument when the ranks hold different tensor counts.
SyncReport compareReplicas(comm::Communicator& comm,
                           const std::vector<std::pair<std::string, Tensor>>& tensors,
                           int64_t step = -1);

/// compareReplicas(), throwing ReplicaMismatch with the report's description on every rank
/// when the weights are out of sync.
void checkReplicasInSync(comm::Communicator& comm,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         int64_t step = -1);

}  // namespace kolo::observe
