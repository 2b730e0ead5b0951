// ModelParallelEngine: the mesh's groups, this rank's part of the model (a pipeline stage,
// cut from the tensor-parallel model when tp > 1), the step with the replicas' gradient
// average, and the whole model's state gathered to rank 0 and cut back into parts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kolo/error.h"
#include "kolo/ops.h"
#include "kolo/safetensors.h"
#include "kolo/train/model_parallel.h"
#include "train/evaluate_parts.h"
#include "train/model_parts.h"

namespace kolo::train {
namespace {

std::string meshText(const parallel::MeshShape& shape) {
  return "dp=" + std::to_string(shape.dp) + ",pp=" + std::to_string(shape.pp) +
         ",tp=" + std::to_string(shape.tp);
}

// Split points that are increasing and above 0 (the stage checks them against the model).
bool plausibleSplits(const std::vector<int>& splits, int stages) {
  if (static_cast<int>(splits.size()) != stages - 1) return false;
  int previous = 0;
  for (const int s : splits) {
    if (s <= previous) return false;
    previous = s;
  }
  return true;
}

// The loss averaged over the data group (the replicas' shares of the batch are equal).
double meanOverReplicas(double loss, comm::Communicator* data) {
  if (data) data->allreduce(&loss, &loss, 1, DType::F64, comm::ReduceOp::Avg);
  return loss;
}

// Correct predictions of logits split by vocabulary over `tensor` (rank t holds classes
// t·W … t·W + W − 1, W the local width) against whole `labels`: every rank's best class per
// position is gathered, and the first of equal maxima wins, as over whole logits.
// Collective over `tensor`.
int64_t countCorrectSplit(const Tensor& logits, const Tensor& labels, comm::Communicator& tensor) {
  const Tensor local = logits.contiguous();
  const int64_t width = local.size(local.dim() - 1);
  const auto positions = static_cast<size_t>(labels.numel());
  const float* values = local.data<float>();
  std::vector<double> mine(2 * positions);
  for (size_t i = 0; i < positions; ++i) {
    const float* row = values + static_cast<int64_t>(i) * width;
    const int64_t best = detail::argmaxOf(row, width);
    mine[2 * i] = row[best];
    mine[2 * i + 1] = static_cast<double>(best + tensor.rank() * width);
  }
  std::vector<double> all(mine.size() * static_cast<size_t>(tensor.size()));
  tensor.allgather(mine.data(), all.data(), mine.size(), DType::F64);
  const std::vector<double> classes = labels.toDoubleVector();
  int64_t correct = 0;
  for (size_t i = 0; i < positions; ++i) {
    size_t best = 2 * i;
    for (size_t r = 1; r < static_cast<size_t>(tensor.size()); ++r)
      if (all[r * mine.size() + 2 * i] > all[best]) best = r * mine.size() + 2 * i;
    correct += all[best + 1] == classes[i];
  }
  return correct;
}

// A group of one rank needs no messages: treat it as none.
std::shared_ptr<comm::Communicator> unlessAlone(std::shared_ptr<comm::Communicator> comm) {
  return comm && comm->size() > 1 ? comm : nullptr;
}

}  // namespace

ModelParallelEngine::ModelParallelEngine(ModelFactory model, parallel::OptimizerFactory optimizer,
                                         ModelParallelOptions options)
    : factory_(std::move(model)), options_(std::move(options)) {
  const parallel::MeshShape& shape = options_.mesh;
  KOLO_REQUIRE(factory_ != nullptr && optimizer != nullptr,
               "ModelParallelEngine: the model and optimizer factories must be set");
  KOLO_REQUIRE(shape.dp >= 1 && shape.pp >= 1 && shape.tp >= 1,
               "ModelParallelEngine: the mesh's sizes must be at least 1, got ", meshText(shape));
  const std::shared_ptr<comm::Communicator>& world = options_.communicator;
  const int worldSize = world ? world->size() : 1;
  KOLO_REQUIRE(shape.size() == worldSize, "ModelParallelEngine: the mesh ", meshText(shape),
               " needs ", shape.size(), " ranks, this job has ", worldSize);
  KOLO_REQUIRE(options_.microBatches >= 1,
               "ModelParallelEngine: microBatches must be at least 1, got ", options_.microBatches);
  KOLO_REQUIRE(!options_.loss || shape.tp == 1,
               "ModelParallelEngine: with tp ", shape.tp, " the loss is the tensor-parallel "
               "model's cross-entropy; leave ModelParallelOptions::loss empty");
  KOLO_REQUIRE(!options_.sequenceParallel || shape.tp > 1,
               "ModelParallelEngine: sequenceParallel needs tp > 1, the mesh is ", meshText(shape));
  KOLO_REQUIRE(!options_.fsdp || (shape.pp == 1 && shape.dp > 1 && !options_.sequenceParallel),
               "ModelParallelEngine: fsdp shards the replicas (dp > 1) of a model without pipeline stages "
               "and without sequenceParallel; the mesh is ", meshText(shape),
               options_.sequenceParallel ? " with sequenceParallel" : "");
  if (worldSize > 1) {
    groups_ = parallel::makeMesh(*world, shape);
    groups_.data = unlessAlone(groups_.data);
    groups_.pipeline = unlessAlone(groups_.pipeline);
    groups_.tensor = unlessAlone(groups_.tensor);
    groups_.model = unlessAlone(groups_.model);
  }

  std::shared_ptr<nn::Module> local = buildLocalModel();
  KOLO_REQUIRE(local != nullptr, "ModelParallelEngine: the model factory returned no model");
  // A pipeline cuts a Sequential between its layers; one stage holds any module tree whole.
  const auto layers = std::dynamic_pointer_cast<nn::Sequential>(local);
  KOLO_REQUIRE(layers || shape.pp == 1, "ModelParallelEngine: ", shape.pp, " pipeline stages cut an "
               "nn::Sequential between its layers, and the model factory built another module; build "
               "the model as a Sequential of its layers, or train it with pp = 1");
  std::vector<int> splits = options_.splitAt;
  if (shape.pp > 1 && splits.empty()) {
    KOLO_REQUIRE(options_.splitSample.defined(),
                 "ModelParallelEngine: ", shape.pp, " stages without splitAt need a splitSample "
                 "to measure the layers on");
    // World rank 0 measures, so that every replica and tensor rank cuts alike.
    splits = parallel::measuredSplit(*world, *layers, options_.splitSample,
                                     options_.measureRepeats, &layerCosts_, shape.pp);
  }
  parallel::StageLossFn loss = options_.loss;
  if (!loss) loss = [](const Tensor& out, const Tensor& y) { return crossEntropy(out, y); };
  if (shape.tp > 1) {
    // The model is split in place by the plan (checked over every stage first); stages are
    // cut from it, and its loss takes logits split by vocabulary.
    parallel::TensorParallelPlan plan = options_.plan ? *options_.plan : parallel::defaultPlan(*local);
    plan.sequenceParallel = plan.sequenceParallel || options_.sequenceParallel;
    tensorModel_ = std::make_shared<parallel::TensorParallelModel>(local, groups_.tensor, std::move(plan),
                                                                   groups_.pipeline.get());
    loss = [tp = tensorModel_](const Tensor& out, const Tensor& y) { return tp->loss(out, y); };
  }
  const parallel::PipelineOptions pipeline{
      .microBatches = options_.microBatches, .schedule = options_.schedule, .recompute = options_.recompute};
  // With fsdp the sharded strategy steps; the stage evaluates and names the parts, with an
  // optimizer that holds no state and never steps.
  parallel::OptimizerFactory stageOptimizer = optimizer;
  if (options_.fsdp)
    stageOptimizer = [](const parallel::NamedTensors& parameters) {
      return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{});
    };
  parallel::StageLossFn stageLoss = loss;
  stage_ = layers ? std::make_unique<parallel::PipelineStage>(groups_.pipeline, *layers, std::move(splits), pipeline,
                                                              std::move(stageLoss), stageOptimizer)
                  : std::make_unique<parallel::PipelineStage>(groups_.pipeline, local, pipeline, std::move(stageLoss),
                                                              stageOptimizer);
  // Ties named by the options and those the local model shows (a model built whole).
  std::vector<parallel::TiedParameter>& ties = ties_;
  ties = options_.tiedParameters;
  for (const parallel::TiedParameter& found : parallel::tiedParameters(*local))
    if (std::none_of(ties.begin(), ties.end(), [&](const parallel::TiedParameter& t) {
          return t.first == found.first && t.second == found.second;
        }))
      ties.push_back(found);
  if (shape.pp > 1) {
    // Under tensor parallelism the two copies are split alike (the plan refuses a tie split
    // two ways), so each tensor rank sums its shards' gradients with its own pipeline's.
    // A Sequential's layers may carry names of the caller's ("embed"), which ties name.
    std::vector<std::string> layerNames;
    for (const auto& [name, child] : layers->children()) layerNames.push_back(name);
    tied_ = std::make_unique<parallel::TiedGradients>(groups_.pipeline, stage_->bounds(), groups_.stage,
                                                      stage_->module(), ties, layerNames);
    if (tied_->empty()) tied_.reset();
  }
  countParameters(ties);
  if (options_.fsdp) {
    // The data group holds the ranks of every replica with this tensor rank's shards: fsdp
    // shards those again (collective over the data group).
    auto model = std::shared_ptr<nn::Module>(&stage_->module(), [](nn::Module*) {});
    fsdp_ = parallel::makeFsdpStrategy(
        groups_.data, *options_.fsdp, [model] { return model; }, std::move(optimizer),
        [loss](nn::Module& m, const Tensor& x, const Tensor& y) { return loss(m(x), y); });
  }
  // Every rank's own count for the start line, once fsdp has cut its shards.
  const double mine = static_cast<double>(parameterCount());
  std::vector<double> all(static_cast<size_t>(worldSize), mine);
  if (worldSize > 1) world->allgather(&mine, all.data(), 1, DType::F64);
  rankParameters_.assign(all.begin(), all.end());
}

void ModelParallelEngine::countParameters(const std::vector<parallel::TiedParameter>& ties) {
  // The whole model's count: each stage's parameters, a split one T times, summed over the
  // stages, a tied table once (its copy on a stage without the first name is not counted).
  std::set<std::string> held;
  for (const auto& [name, t] : stage_->module().stateDict()) held.insert(name);
  auto copyOfATie = [&](const std::string& name) {
    return std::any_of(ties.begin(), ties.end(), [&](const parallel::TiedParameter& tie) {
      return tie.second == name && !held.count(tie.first);
    });
  };
  double whole = 0.0;
  const auto* specs = tensorModel_ ? &tensorModel_->shardSpecs() : nullptr;
  for (const auto& [name, t] : stage_->module().namedParameters()) {
    if (copyOfATie(name)) continue;
    const bool split = specs && specs->count(name) && specs->at(name).dim >= 0;
    whole += static_cast<double>(t.numel()) * (split ? options_.mesh.tp : 1);
  }
  if (groups_.pipeline)
    groups_.pipeline->allreduce(&whole, &whole, 1, DType::F64, comm::ReduceOp::Sum);
  modelParameters_ = static_cast<int64_t>(whole);
}

ModelParallelEngine::~ModelParallelEngine() = default;

std::shared_ptr<nn::Module> ModelParallelEngine::buildLocalModel() {
  const int stages = options_.mesh.pp;
  if (!options_.modelPart || !plausibleSplits(options_.splitAt, stages)) return factory_();
  // Given split points: build only this rank's layers (the stage checks the points).
  const int stageIndex = groups_.stage;
  const int begin = stageIndex == 0 ? 0 : options_.splitAt[static_cast<size_t>(stageIndex) - 1];
  const int end = stageIndex + 1 < stages ? options_.splitAt[static_cast<size_t>(stageIndex)] : -1;
  return options_.modelPart(begin, end);
}

double ModelParallelEngine::step(const data::Batch& batch, double lr) {
  wholeCurrent_ = false;
  if (fsdp_) {
    fsdp_->setLr(lr);
    const double loss = fsdp_->trainStep(batch.inputs, batch.labels).loss;
    requireSplitModulesReached();
    return loss;
  }
  stage_->optimizer().setLr(lr);
  comm::Communicator* data = groups_.data.get();
  const bool sequenceParallel = tensorModel_ && tensorModel_->plan().sequenceParallel;
  if (!data && !sequenceParallel && !tied_) {
    lastStats_ = stage_->trainStep(batch.inputs, batch.labels);
    requireSplitModulesReached();
    return lastStats_.loss;
  }
  // Tied copies on two stages sum their gradients; a replica of a hybrid averages its
  // gradients with the same part of the others (the sequence-parallel norms' first summed
  // over the tensor ranks' tokens).
  const auto start = std::chrono::steady_clock::now();
  stage_->optimizer().zeroGrad();
  parallel::PipelineStepStats stats = stage_->forwardBackward(batch.inputs, batch.labels);
  const auto update = std::chrono::steady_clock::now();
  if (tensorModel_) tensorModel_->synchronizeGradients();
  if (tied_) tied_->sum();
  if (data) parallel::averageGradients(stage_->module(), *data);
  stage_->optimizer().step();
  if (data) stats.loss = meanOverReplicas(stats.loss, data);
  const auto end = std::chrono::steady_clock::now();
  stats.computeSeconds += std::chrono::duration<double>(end - update).count();
  stats.stepSeconds = std::chrono::duration<double>(end - start).count();
  lastStats_ = stats;
  requireSplitModulesReached();
  return stats.loss;
}

void ModelParallelEngine::requireSplitModulesReached() {
  // Once, after the first step: every stage's split modules ran their communication.
  if (!tensorModel_ || reachedChecked_) return;
  reachedChecked_ = true;
  tensorModel_->requireReached(&stage_->module());
}

EvaluateResult ModelParallelEngine::evaluate(const data::Dataset& dataset,
                                             EvaluateOptions options) {
  KOLO_REQUIRE(options.batch >= 1, "train::evaluate: batch must be at least 1, got ", options.batch);
  // Each replica takes a contiguous slice of the dataset and passes it through its stages in
  // chunks of options.batch rows; no rank holds more than its part of the model.
  const int dp = options_.mesh.dp;
  const int64_t n = dataset.size();
  const int64_t begin = n * groups_.replica / dp;
  const int64_t end = n * (groups_.replica + 1) / dp;
  const int64_t chunks = (end - begin + options.batch - 1) / options.batch;
  auto chunk = [&](int64_t c) {
    const int64_t from = begin + c * options.batch;
    return detail::datasetRows(dataset, from, std::min(from + options.batch, end));
  };
  const bool splitOutput = tensorModel_ && tensorModel_->outputSplitByVocabulary();
  OutputLoss loss = options.loss ? options.loss : options_.loss;
  if (tensorModel_) loss = [tp = tensorModel_](const Tensor& out, const Tensor& y) { return tp->loss(out, y); };
  if (!loss) loss = [](const Tensor& out, const Tensor& y) { return crossEntropy(out, y); };
  double sums[3] = {0.0, 0.0, 0.0};  // loss summed over samples, correct predictions, predictions
  if (fsdp_) fsdp_->gatherModel();  // whole parameters (this rank's tensor shards) for the forwards
  stage_->module().train(false);
  stage_->forwardOnly(chunks, [&](int64_t c) { return chunk(c).inputs; },
                      [&](int64_t c, const Tensor& output) {
                        const Tensor labels = chunk(c).labels;
                        const double lossSum = loss(output, labels).item() * static_cast<double>(labels.size(0));
                        int64_t correct = 0, predictions = 0;
                        if (splitOutput) {
                          correct = countCorrectSplit(output, labels, *groups_.tensor);
                          predictions = labels.numel();
                        } else if (detail::scoresPerLabel(output, labels)) {
                          correct = detail::countCorrect(output, labels);
                          predictions = labels.numel();
                        }
                        if (groups_.tensorRank != 0) return;  // the tensor ranks hold the same figures
                        sums[0] += lossSum;
                        sums[1] += static_cast<double>(correct);
                        sums[2] += static_cast<double>(predictions);
                      });
  stage_->module().train(true);
  comm::Communicator* world = options_.communicator.get();
  if (world && world->size() > 1) {
    const double mine[3] = {sums[0], sums[1], sums[2]};
    world->allreduce(mine, sums, 3, DType::F64, comm::ReduceOp::Sum);
  }
  EvaluateResult result;
  result.samples = n;
  if (n > 0) result.loss = sums[0] / static_cast<double>(n);
  if (sums[2] > 0) result.accuracy = sums[1] / sums[2];
  return result;
}

void ModelParallelEngine::refineStepFigures(StepFigures& figures) const {
  figures.computeSeconds = lastStats_.computeSeconds;
  figures.microBatchesHeld = lastStats_.peakMicroBatchesHeld;
  figures.boundaryBytes = static_cast<int64_t>(lastStats_.peakBoundaryBytes);
}

DataShard ModelParallelEngine::dataShard() const {
  return {groups_.replica, options_.mesh.dp};
}

nn::Module& ModelParallelEngine::model() {
  if (wholeCurrent_ && whole_) return *whole_;
  return stage_->module();
}

comm::Communicator* ModelParallelEngine::gatherGroup() const { return groups_.model.get(); }

std::vector<parallel::ModelPiece> ModelParallelEngine::weightPieces() const {
  return detail::weightPieces(stage_->module(),
                              tensorModel_ ? tensorModel_->shardSpecs() : detail::ShardSpecs{});
}

std::vector<parallel::ModelPiece> ModelParallelEngine::optimizerPieces(
    const optim::StateDict& state) const {
  return detail::optimizerPieces(stage_->module(), state,
                                 tensorModel_ ? tensorModel_->shardSpecs() : detail::ShardSpecs{});
}

void ModelParallelEngine::gatherModel() {
  if (fsdp_) fsdp_->gatherModel();  // every replica: the shards gathered over the data group
  // Replica 0's model group gathers; the other replicas hold the same weights.
  if (groups_.replica != 0) return;
  const NamedTensors gathered = detail::gatherPieces(gatherGroup(), weightPieces());
  if (!isPrimary()) return;
  if (!whole_) whole_ = factory_();
  checkpoint::copyIntoTensors({gathered, {}}, whole_->stateDict(), true, "the gathered model");
  wholeCurrent_ = true;
}

double ModelParallelEngine::lr() const { return fsdp_ ? fsdp_->optimizer().lr() : stage_->optimizer().lr(); }

std::shared_ptr<comm::Communicator> ModelParallelEngine::communicator() const {
  return options_.communicator;
}

std::string ModelParallelEngine::name() const {
  const parallel::MeshShape& shape = options_.mesh;
  if (shape.size() == 1) return "one-device";
  if (shape.dp == 1 && shape.tp == 1) return "pipeline";
  if (shape.dp == 1 && shape.pp == 1) return "tensor";
  return "mesh " + meshText(shape);
}

int ModelParallelEngine::replicas() const { return options_.mesh.dp; }

observe::Fields ModelParallelEngine::describe() const {
  const std::vector<int>& b = stage_->bounds();
  std::string layers;
  char one[48];
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    std::snprintf(one, sizeof(one), "%s%d-%d", s ? " " : "", b[s], b[s + 1] - 1);
    layers += one;
  }
  std::string costs;
  for (const double c : layerCosts_) {
    std::snprintf(one, sizeof(one), "%s%.2f", costs.empty() ? "" : " ", 1000.0 * c);
    costs += one;
  }
  std::string byRank;
  for (const int64_t n : rankParameters_) {
    if (!byRank.empty()) byRank += ',';
    byRank += std::to_string(n);
  }
  std::snprintf(one, sizeof(one), "%.4f",
                modelParameters_ > 0 ? static_cast<double>(parameterCount()) / static_cast<double>(modelParameters_) : 1.0);
  // The modules whose parameters the plan split (not the replicated ones and norms).
  int64_t splitting = 0;
  if (tensorModel_)
    for (const auto& [path, style] : tensorModel_->splitModules())
      splitting += style != "replicated" && style != "sequence-parallel norm";
  return {{"rank_parameters", parameterCount()},
          {"model_parameters", modelParameters_},
          {"rank_share", std::string(one)},
          {"parameters_by_rank", byRank},
          {"tp_plan", tensorModel_ ? tensorModel_->plan().name : std::string("none")},
          {"tp_modules_split", splitting},
          {"dp", options_.mesh.dp},
          {"stages", options_.mesh.pp},
          {"tp", options_.mesh.tp},
          {"sequence_parallel", options_.sequenceParallel},
          {"fsdp", options_.fsdp ? parallel::shardLevelName(options_.fsdp->shard) : "none"},
          {"micro_batches", options_.microBatches},
          {"pipeline_schedule", parallel::pipelineScheduleName(options_.schedule)},
          {"recompute", options_.recompute},
          {"stage_layers", layers},
          {"split", options_.mesh.pp == 1 ? "none" : layerCosts_.empty() ? "given" : "measured"},
          {"layer_ms", costs}};
}

StateDict ModelParallelEngine::stateDict() {
  StateDict state;
  // fsdp: every replica's shards assembled into whole parameters and optimizer state on the
  // data group's rank 0, replica 0 (collective over the data group).
  if (fsdp_) fsdp_->consolidateState();
  if (groups_.replica != 0) return state;  // the other replicas hold the same state
  optim::Optimizer& wholeOptimizer = fsdp_ ? fsdp_->checkpointOptimizer() : stage_->optimizer();
  comm::Communicator* group = gatherGroup();
  NamedTensors weights = detail::gatherPieces(group, weightPieces());
  const optim::StateDict local = wholeOptimizer.stateDict();
  NamedTensors slots = detail::gatherPieces(group, optimizerPieces(local));
  if (!isPrimary()) return state;
  state.weights = std::move(weights);
  state.optimizerKind = wholeOptimizer.kind();
  state.optimizer = optim::StateDict::fromFlat(slots, local.scalars);
  state.metadata = {{"strategy", name()}};
  return state;
}

void ModelParallelEngine::loadStateDict(const StateDict& state) {
  comm::Communicator* world = options_.communicator.get();
  detail::WholeState whole{state.weights, state.optimizerKind, state.optimizer};
  if (world && world->size() > 1) whole = detail::broadcastWholeState(*world, whole);
  if (fsdp_) fsdp_->gatherModel();  // whole parameters to load into (collective)
  detail::PartShape part{&stage_->module(), fsdp_ ? &fsdp_->checkpointOptimizer() : &stage_->optimizer(),
                         tensorModel_ ? tensorModel_->shardSpecs() : detail::ShardSpecs{},
                         groups_.tensorRank, options_.mesh.tp, ties_};
  std::exception_ptr problem;
  try {
    detail::loadPart(whole, part);
  } catch (const Error&) {
    problem = std::current_exception();
  }
  detail::agreeLoaded(world, problem, "the checkpoint's state");
  if (fsdp_) fsdp_->syncReplicas();  // every replica keeps its shards of what it loaded
  wholeCurrent_ = false;
}

const std::vector<int>& ModelParallelEngine::bounds() const { return stage_->bounds(); }
parallel::PipelineStage& ModelParallelEngine::stage() { return *stage_; }
optim::Optimizer& ModelParallelEngine::optimizer() { return fsdp_ ? fsdp_->optimizer() : stage_->optimizer(); }

int64_t ModelParallelEngine::parameterCount() const {
  if (!fsdp_ || options_.fsdp->shard != parallel::ShardLevel::Full) return stage_->module().parameterCount();
  // ZeRO-3 keeps only the shards its optimizer steps between steps.
  int64_t kept = 0;
  for (const auto& [name, shard] : fsdp_->optimizer().parameters()) kept += shard.numel();
  return kept;
}

}  // namespace kolo::train
