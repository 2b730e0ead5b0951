// The model-parallel engine: the user's nn::Sequential cut into pipeline stages (GPipe or
// 1F1B over micro-batches, split by measured layer cost or at given points, optionally
// recomputing activations), its layers split over tensor-parallel ranks (Megatron style,
// optionally sequence-parallel), or both, and the whole replicated over data-parallel groups:
// the dp × pp × tp mesh of parallel::makeMesh. train::fit drives it like any Engine; its
// checkpoints hold the whole model's tensors, so a run saved in one layout resumes in any
// other (and in a DataParallelEngine).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/parallel/fsdp.h"
#include "kolo/parallel/mesh.h"
#include "kolo/parallel/pipeline.h"
#include "kolo/parallel/tensor_parallel.h"
#include "kolo/parallel/tied_parameters.h"
#include "kolo/train/engine.h"

namespace kolo::train {

/// Builds the whole model, any module tree. Called on every rank (each builds it alike: the
/// same seed or the same weights file), which keeps only its part, and again on rank 0 by
/// gatherModel(). A pipeline (pp > 1) needs an nn::Sequential to cut into stages of layers;
/// with pp = 1 (tensor parallelism, data-parallel replicas, one process) any nn::Module is
/// trained whole under its own names, so a plan's paths are the model's ("blocks.*.attn.q").
using ModelFactory = std::function<std::shared_ptr<nn::Module>()>;
/// A factory of Sequential models (converts to a ModelFactory).
using SequentialFactory = std::function<std::shared_ptr<nn::Sequential>()>;
/// Builds only layers [begin, end) of the model (end < 0: to the last layer), with empty
/// placeholders for the others (nn::makeLanguageModelPart), so that a stage never holds the
/// whole model.
using SequentialPartFactory = std::function<std::shared_ptr<nn::Sequential>(int begin, int end)>;

/// How a ModelParallelEngine splits the model and the job.
struct ModelParallelOptions {
  /// The job's ranks (e.g. parallel::init()); null: one process, which holds the whole model.
  std::shared_ptr<comm::Communicator> communicator{};
  /// Data-parallel replicas × pipeline stages × tensor-parallel ranks; their product must be
  /// the communicator's size. World rank w = d·(pp·tp) + s·tp + t (parallel::makeMesh).
  parallel::MeshShape mesh{};

  /// Pipeline: micro-batches per step (each replica's batch must be a multiple), schedule,
  /// recomputation (parallel::PipelineOptions).
  int microBatches = 1;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::OneFOneB;
  bool recompute = false;
  /// The first layer of stages 1 … pp−1; empty: split by the layers' measured cost
  /// (parallel::measuredSplit on world rank 0, so that every replica and tensor rank cuts
  /// alike).
  std::vector<int> splitAt{};
  /// The inputs the layer costs are measured on (one micro-batch, e.g. the first rows of a
  /// batch); required when pp > 1 and splitAt is empty. Every rank passes the same shape.
  Tensor splitSample{};
  /// Timed passes per layer when measuring.
  int measureRepeats = 3;
  /// With splitAt given, builds only each stage's layers (see SequentialPartFactory); null:
  /// every rank builds the whole model and keeps its stage.
  SequentialPartFactory modelPart{};

  /// Tensor parallelism (tp > 1): how the model is split (parallel::TensorParallelPlan, paths
  /// of the whole model's names: "3.attn", "*.mlp.0"); unset: parallel::defaultPlan of the
  /// model (kolo's own blocks). Checked before training (TensorParallelModel's constructor,
  /// over every stage): a pattern that matches nothing, a split that does not divide, or a
  /// plan that splits nothing is an InvalidArgument.
  std::optional<parallel::TensorParallelPlan> plan{};
  /// Sequence-parallel norms and residuals: sets the plan's sequenceParallel.
  bool sequenceParallel = false;

  /// Fully sharded data parallelism over the replicas (pp = 1, dp > 1; torchtitan's 2-D
  /// FSDP × TP): instead of averaging whole gradients, the dp ranks that hold the same tensor
  /// shards shard them again, their gradients and the optimizer state (parallel::
  /// makeFsdpStrategy over the data group; ZeRO-3 gathers each unit's parameters for its
  /// forward and backward). Unset: the replicas average their gradients. Refused with
  /// pipeline stages and with sequenceParallel.
  std::optional<parallel::FsdpOptions> fsdp{};

  /// Parameters shared by two layers (tied embeddings), by whole-model names: when the
  /// pipeline puts the two on different stages, their gradients are summed between those
  /// stages before every step (parallel::TiedGradients). Those of a model built whole are
  /// found by themselves (parallel::tiedParameters); a modelPart's must be named here (the
  /// llama lm's: {"0.weight", "<layers+2>.weight"}).
  std::vector<parallel::TiedParameter> tiedParameters{};

  /// The mean loss of the last stage's output against a batch's labels; default
  /// cross-entropy. With tp > 1 the loss is the tensor-parallel model's cross-entropy
  /// (parallel::TensorParallelModel::loss, vocabulary-parallel for split logits), and
  /// setting this one is refused.
  parallel::StageLossFn loss{};
};

/// Pipeline, tensor and hybrid (mesh) parallelism over the user's own model: any nn::Module
/// for tensor parallelism and data-parallel replicas, an nn::Sequential (cut between its
/// layers) when there are pipeline stages. Each
/// step the ranks of one replica run the replica's share of the global batch through the
/// model: every stage loads the whole share (the first reads its inputs, the last its
/// labels), micro-batches flow under the schedule, tensor ranks split each layer, and the
/// replicas average their gradients before every rank steps its optimizer over its part.
/// The update equals one device's on the whole batch (to float rounding). Stateful: the whole
/// model's weights and optimizer state (every part reassembled on rank 0; on load, each rank
/// cuts its part), so any layout, or a DataParallelEngine, may load what another saved.
class ModelParallelEngine : public Engine {
 public:
  /// Builds this rank's part of `model` (see ModelFactory; a SequentialFactory converts) with
  /// an optimizer over its parameters (whole-model names) from `optimizer`. Blocking;
  /// collective over the communicator (the mesh's groups are split off it; a measured split
  /// times the layers on rank 0 and broadcasts the cut). Throws InvalidArgument for a mesh
  /// whose size is not the communicator's, pp > 1 with a model that is not an nn::Sequential,
  /// pp > 1 without splitAt or splitSample, split points that do not fit the model, sizes
  /// that tp does not divide, a loss given with tp > 1, microBatches below 1.
  ModelParallelEngine(ModelFactory model, parallel::OptimizerFactory optimizer, ModelParallelOptions options);
  ~ModelParallelEngine() override;
  ModelParallelEngine(const ModelParallelEngine&) = delete;
  ModelParallelEngine& operator=(const ModelParallelEngine&) = delete;

  /// One step over this replica's share `batch` of the global batch (dataShard()). Returns
  /// the global batch's mean loss, on every rank. Blocking; collective. Throws
  /// InvalidArgument when the micro-batches cannot share the batch's rows, PeerError or
  /// Timeout when a neighbour fails.
  double step(const data::Batch& batch, double lr) override;
  /// Evaluates where the model lives: each replica passes its contiguous slice of `dataset`
  /// through its stages in chunks of options.batch rows (PipelineStage::forwardOnly, no
  /// autograd, eval mode), its last stage sums the loss (options.loss, else this engine's;
  /// with tp > 1 always the tensor-parallel model's cross-entropy) and the correct argmax
  /// predictions (over logits split by vocabulary too), and every rank returns the figures
  /// of the whole dataset, as train::evaluate would give on one process. No rank holds more
  /// than its part of the model. Blocking; collective.
  EvaluateResult evaluate(const data::Dataset& dataset, EvaluateOptions options = {}) override;
  /// The replica's index and the replica count: every rank of a replica loads its share.
  DataShard dataShard() const override;
  /// This rank's part (its stage's layers, or its shards of them) until gatherModel(); then,
  /// on rank 0, the whole model until the next step.
  nn::Module& model() override;
  /// Copies every part into a whole model on rank 0 (built with the factory once). Blocking;
  /// collective.
  void gatherModel() override;
  double lr() const override;
  std::shared_ptr<comm::Communicator> communicator() const override;
  /// "one-device" (one process), "pipeline" (one replica, no tensor split), "tensor" (one
  /// replica of one stage), else "mesh dp=D,pp=P,tp=T".
  std::string name() const override;
  /// The data-parallel replicas (mesh.dp).
  int replicas() const override;
  /// Stages, micro-batches, schedule, each stage's layers and how they were chosen, the
  /// measured layer costs, tp, dp, the tensor-parallel plan's name and the modules it split,
  /// the whole model's parameter count, this rank's and its share of the whole, and every
  /// rank's count.
  observe::Fields describe() const override;
  /// The whole model's weights and optimizer state on rank 0 (replica 0's ranks send their
  /// parts; the optimizer's per-element slots are reassembled like their parameters), and
  /// metadata "strategy". Blocking; collective.
  StateDict stateDict() override;
  /// Takes rank 0's whole state: every rank receives it and keeps its part (weights and
  /// optimizer slots cut as its parameters are). Blocking; collective. Throws Mismatch on
  /// every rank when a tensor is missing or of another shape, or the optimizer kind differs.
  void loadStateDict(const StateDict& state) override;
  /// The stage's own compute (waits for its neighbours left out), the micro-batches it held
  /// and its boundary bytes in the last step.
  void refineStepFigures(StepFigures& figures) const override;

  /// Layer bounds of the stages, {0, splits…, n}.
  const std::vector<int>& bounds() const;
  /// The layer costs (seconds) the split was measured from; empty with given split points.
  const std::vector<double>& layerCosts() const { return layerCosts_; }
  /// What the last step did on this rank (peaks of held micro-batches, boundary and step
  /// memory; compute and step seconds).
  const parallel::PipelineStepStats& lastStepStats() const { return lastStats_; }
  /// The mesh's groups of this rank (all null for one process; dp == 1: no data group).
  const parallel::MeshGroups& groups() const { return groups_; }
  const parallel::MeshShape& mesh() const { return options_.mesh; }
  /// The options it was built with.
  const ModelParallelOptions& options() const { return options_; }
  /// This rank's stage.
  parallel::PipelineStage& stage();
  /// The optimizer of this rank's part (with fsdp: of its shards of it).
  optim::Optimizer& optimizer();
  /// Elements of the parameters this rank keeps between steps: its stage's, tensor shards
  /// included; under fsdp's ZeRO-3 (FsdpOptions::shard full) only its shards of those.
  int64_t parameterCount() const;
  /// Elements of the whole model's parameters.
  int64_t modelParameterCount() const { return modelParameters_; }
  /// The tensor-parallel split (tp > 1), else null.
  const std::shared_ptr<parallel::TensorParallelModel>& tensorModel() const { return tensorModel_; }

 private:
  std::shared_ptr<nn::Module> buildLocalModel();
  std::vector<parallel::ModelPiece> weightPieces() const;
  std::vector<parallel::ModelPiece> optimizerPieces(const optim::StateDict& state) const;
  comm::Communicator* gatherGroup() const;
  void countParameters(const std::vector<parallel::TiedParameter>& ties);
  void requireSplitModulesReached();

  ModelFactory factory_;
  ModelParallelOptions options_;
  parallel::MeshGroups groups_;
  std::vector<double> layerCosts_;
  std::shared_ptr<parallel::TensorParallelModel> tensorModel_;  // tp > 1
  std::unique_ptr<parallel::PipelineStage> stage_;
  std::unique_ptr<parallel::Strategy> fsdp_;  // options.fsdp: the replicas' sharded update
  std::vector<parallel::TiedParameter> ties_;       // named in the options or found in the model
  std::unique_ptr<parallel::TiedGradients> tied_;  // copies of tied parameters on two stages
  std::shared_ptr<nn::Module> whole_;  // rank 0 after gatherModel()
  bool wholeCurrent_ = false;
  int64_t modelParameters_ = 0;
  bool reachedChecked_ = false;
  std::vector<int64_t> rankParameters_;  // every world rank's, in rank order
  parallel::PipelineStepStats lastStats_;
};

}  // namespace kolo::train
