// Pipeline parallelism: a Sequential model cut into P contiguous stages, one rank each.
// Every step splits the global batch into M micro-batches; activations travel forward and
// their gradients backward by point-to-point messages on the Communicator, in the order of
// the schedule (GPipe: every forward, then every backward; 1F1B / PipeDream-Flush: after a
// warm-up, one forward and one backward alternate, so a stage holds at most P micro-batches).
// The loss lives on the last stage; gradients accumulate over the micro-batches (each
// micro-batch's mean loss is scaled by 1/M), so the update equals the whole batch's, and
// every stage steps its own optimizer after the flush. Split points come from the caller or
// from partitionByCost() over measured per-layer costs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/layers.h"
#include "kolo/optim.h"
#include "kolo/tensor.h"

namespace kolo::parallel {

enum class PipelineSchedule { GPipe, OneFOneB };

/// "gpipe" or "1f1b".
const char* pipelineScheduleName(PipelineSchedule schedule);
/// Parses "gpipe" or "1f1b"; throws InvalidArgument naming the word otherwise.
PipelineSchedule parsePipelineSchedule(const std::string& name);

/// One entry of a stage's schedule: the forward or the backward of micro-batch `microBatch`.
struct PipelineAction {
  bool forward = true;
  int microBatch = 0;
};

/// The order in which stage `stage` of `stages` runs the forwards and backwards of
/// `microBatches` micro-batches. Both schedules run the backwards in micro-batch order (so
/// gradients accumulate in the same order and both give bit-identical updates). 1F1B: stage
/// s warms up with min(P - s - 1, M) forwards, then alternates forward and backward, then
/// drains the remaining backwards. Throws InvalidArgument for a stage outside [0, stages) or
/// counts below 1.
std::vector<PipelineAction> pipelineActions(PipelineSchedule schedule, int stages, int stage,
                                            int microBatches);

/// Split points for `stages` contiguous stages of layers with costs `costs` (seconds, or any
/// additive unit): P - 1 increasing layer indices; stage s holds layers [b_s, b_{s+1}) with
/// b = {0, splits..., n}. Minimises the cost of the slowest stage exactly (dynamic programme
/// over prefixes, O(P n^2)); among equal optima it takes the earliest cut. Every stage gets
/// at least one layer. A pure function of its arguments. Throws InvalidArgument when there
/// are fewer layers than stages, a cost is negative or not finite, or stages < 1.
std::vector<int> partitionByCost(const std::vector<double>& costs, int stages);

/// The largest per-stage sum of `costs` under `splits` (as partitionByCost returns them).
/// Throws InvalidArgument for splits that are not increasing inside (0, n).
double slowestStageCost(const std::vector<double>& costs, const std::vector<int>& splits);

/// Measures each layer of `model`: `repeats` forward and backward passes of layer i on the
/// output of layers 0..i-1 for `input` (after one untimed warm-up pass), seeded with a
/// gradient of ones; returns the median seconds per layer. Leaves gradients of the model's
/// parameters zeroed.
std::vector<double> measureLayerCosts(nn::Sequential& model, const Tensor& input, int repeats = 3);

/// Collective over `comm`: rank 0 measures `model` on `input` (measureLayerCosts) and
/// partitions it into `stages` stages (0: comm->size()); every rank returns rank 0's split
/// points (timings differ between ranks, so only one rank may decide: in a mesh, pass the
/// whole job's communicator, so that every replica cuts alike). `costs`, when given, receives
/// rank 0's measurements on every rank.
std::vector<int> measuredSplit(comm::Communicator& comm, nn::Sequential& model, const Tensor& input,
                               int repeats = 3, std::vector<double>* costs = nullptr,
                               int stages = 0);

/// The layers [begin, end) of a Sequential under their names in the whole model ("3.ln1.weight"),
/// so that a stage's namedParameters() and stateDict() are slices of the whole model's.
/// Shares the layers with the model it was cut from.
class StageModule : public nn::Module {
 public:
  /// Layers [begin, end) of `model`; a model with recompute() on recomputes each of them in
  /// backward (nn::checkpoint per layer) inside the stage too.
  StageModule(const nn::Sequential& model, int begin, int end);
  /// The one stage of a model that is not cut (any module tree): its parameters, buffers and
  /// children under their own names ("attn.q.weight", no layer prefix), forward through the
  /// model's operator() (its hooks and transforms run). Throws InvalidArgument for a null model.
  explicit StageModule(std::shared_ptr<nn::Module> whole);
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  int begin() const { return begin_; }
  int end() const { return end_; }

 private:
  int begin_, end_;
  bool recompute_ = false;
  std::shared_ptr<nn::Module> whole_;  // the uncut model, or null: the Sequential's layers
};

struct PipelineOptions {
  int microBatches = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  /// Keep only each micro-batch's input after its forward (no autograd graph) and run the
  /// forward again, recording, just before its backward. Changes no number: the recomputed
  /// forward is the same computation (no dropout in the stage, or a stage whose dropout
  /// draws are not needed bit-exact).
  bool recompute = false;
  /// Tag base of this pipeline's messages (distinct pipelines on one communicator differ).
  int tagBase = 7100;
};

/// The loss of the last stage: mean loss of the stage's output against a micro-batch's labels.
using StageLossFn = std::function<Tensor(const Tensor& output, const Tensor& labels)>;
/// Builds a stage's optimizer over its parameters (whole-model names).
using StageOptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedParameters& parameters)>;

/// What one step did on this stage.
struct PipelineStepStats {
  /// Mean loss over the global batch; on the last stage, and on every stage when
  /// trainStep's shareLoss is true.
  double loss = 0.0;
  /// The most micro-batches whose forward had run and whose backward had not, at once.
  int peakMicroBatchesHeld = 0;
  /// The most bytes of stage inputs and outputs kept for those micro-batches at once (the
  /// autograd graph's saved tensors come on top unless recompute is on).
  size_t peakBoundaryBytes = 0;
  /// The most tensor bytes alive in this process during the step above those alive at its
  /// start (activations, saved tensors, messages, temporaries; kolo/memory.h). Counts the
  /// whole process: meaningful with one stage per process.
  int64_t peakStepBytes = 0;
  /// Seconds spent computing (forwards, recomputes, backwards, loss) and the step's wall time.
  double computeSeconds = 0.0;
  double stepSeconds = 0.0;
};

/// This rank's stage of a pipeline. Not thread-safe; one per rank.
class PipelineStage {
 public:
  /// `model` is the whole model, built identically on every rank (same seed, or the same
  /// --init file); the stage keeps layers [b_r, b_{r+1}) for r = comm->rank() and holds no
  /// reference to the others. `splits` as partitionByCost returns them, for comm->size()
  /// stages (a null or one-rank comm: one stage, no splits). `loss` runs on the last stage.
  /// Throws InvalidArgument for split points that do not fit the model or the rank count,
  /// or microBatches < 1.
  PipelineStage(std::shared_ptr<comm::Communicator> comm, const nn::Sequential& model,
                std::vector<int> splits, PipelineOptions options, StageLossFn loss,
                const StageOptimizerFactory& optimizerFactory);
  /// One stage holding the whole of `model`, any module tree, under its own names
  /// (StageModule(whole)): the micro-batches and schedule of a one-stage pipeline. `comm` must
  /// be null or of one rank: only a Sequential is cut into stages. Throws InvalidArgument
  /// otherwise, or for microBatches < 1.
  PipelineStage(std::shared_ptr<comm::Communicator> comm, std::shared_ptr<nn::Module> model, PipelineOptions options,
                StageLossFn loss, const StageOptimizerFactory& optimizerFactory);
  ~PipelineStage();

  /// One synchronous step over the global batch: inputs (used by the first stage) and labels
  /// (used by the last), both with B rows, B divisible by microBatches. Zeroes the stage's
  /// gradients, runs the schedule, waits for every message to complete, and steps the
  /// optimizer. With shareLoss, the last stage broadcasts the loss to every stage (a
  /// collective). Blocking; a neighbour that fails ends this call in PeerError or Timeout.
  /// Throws InvalidArgument for a batch that the micro-batches cannot share.
  PipelineStepStats trainStep(const Tensor& inputs, const Tensor& labels, bool shareLoss = true);

  /// Gradients only: trainStep without the zeroing and the optimizer step (gradients add to
  /// what the parameters hold).
  PipelineStepStats forwardBackward(const Tensor& inputs, const Tensor& labels, bool shareLoss = true);

  /// Forward only, without recording autograd (evaluation, inference): `chunks` batches pass
  /// every stage in turn, the first stage reading chunk c from `input(c)` and the last
  /// handing its output to `onOutput(c, output)` (the other stages call neither). Chunks
  /// may differ in rows; the stage's train/eval mode is the caller's. Blocking; collective
  /// over the stages, every one with the same `chunks`. A neighbour that fails ends it in
  /// PeerError or Timeout.
  void forwardOnly(int64_t chunks, const std::function<Tensor(int64_t chunk)>& input,
                   const std::function<void(int64_t chunk, const Tensor& output)>& onOutput);

  /// Collective: copies every stage's parameters and buffers into `whole` on rank `root`
  /// (a model of the same architecture, e.g. built with the same seed; may be null on the
  /// other ranks). The result is the model one-rank training would hold.
  void gatherModel(nn::Module* whole, int root = 0);

  StageModule& module() { return *module_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  bool isFirst() const { return stage_ == 0; }
  bool isLast() const { return stage_ == stages_ - 1; }
  /// Layer boundaries {0, splits..., n}.
  const std::vector<int>& bounds() const { return bounds_; }
  const PipelineOptions& options() const { return options_; }

 private:
  struct InFlight;
  void runForward(int microBatch, const Tensor& inputs, const Tensor& labels, PipelineStepStats& stats);
  void runBackward(int microBatch, PipelineStepStats& stats);
  Tensor receiveActivation(int microBatch);
  void sendActivation(int microBatch, const Tensor& output);
  void sendTensor(const Tensor& t, int peer, int tag);
  void waitSends();
  size_t heldBytes() const;

  std::shared_ptr<comm::Communicator> comm_;
  int stage_ = 0, stages_ = 1;
  std::vector<int> bounds_;
  PipelineOptions options_;
  StageLossFn loss_;
  std::shared_ptr<StageModule> module_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<std::unique_ptr<InFlight>> inFlight_;  // by micro-batch of the current step
  struct PendingSend;
  std::vector<std::unique_ptr<PendingSend>> sends_;
  double lossSum_ = 0.0;
  int held_ = 0;
  int64_t microRows_ = 0;
};

}  // namespace kolo::parallel
