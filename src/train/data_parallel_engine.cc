// DataParallelEngine: a parallel::Strategy with the user's model, loss and optimizer, plus
// what the strategies leave to their caller: clipping on one device, the communication
// hook, balancing, evaluation over the ranks, and the state a checkpoint holds.
#include <exception>
#include <string>
#include <utility>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/parallel/distributed.h"
#include "kolo/safetensors.h"
#include "kolo/train/engine.h"
#include "train/balance.h"
#include "train/compression_state.h"
#include "train/rank_zero.h"

namespace kolo::train {
namespace {

using parallel::StrategyKind;

constexpr const char* kHookPrefix = "compress.rank";

// The factory's models, each recomputing its top-level layers in backward.
parallel::ModelFactory recomputed(parallel::ModelFactory model) {
  return [model = std::move(model)] {
    std::shared_ptr<nn::Module> built = model();
    auto* layers = dynamic_cast<nn::Sequential*>(built.get());
    KOLO_REQUIRE(layers != nullptr,
                 "recompute needs the model to be an nn::Sequential (its top-level layers are "
                 "computed again in backward); a model of another shape calls nn::checkpoint on "
                 "its blocks in its own forward");
    layers->setRecompute(true);
    return built;
  };
}

}  // namespace

void Engine::setAccumulate(int microBatches) {
  KOLO_REQUIRE(microBatches == 1, name(), " does not accumulate gradients over micro-batches (accumulate ",
               microBatches, ")");
}

int Engine::rank() const {
  const std::shared_ptr<comm::Communicator> comm = communicator();
  return comm ? comm->rank() : 0;
}

DataParallelEngine::DataParallelEngine(parallel::ModelFactory model,
                                       parallel::OptimizerFactory optimizer,
                                       DataParallelOptions options)
    : options_(std::move(options)) {
  const StrategyKind kind = options_.strategy.kind;
  const std::string name = parallel::strategyKindName(kind);
  KOLO_REQUIRE(options_.clipNorm >= 0.0, "DataParallelOptions::clipNorm must be at least 0, got ", options_.clipNorm);
  KOLO_REQUIRE(options_.clipNorm == 0.0 || kind == StrategyKind::OneDevice ||
                   kind == StrategyKind::FullyShardedDataParallel,
               "DataParallelOptions::clipNorm is available with the strategies one-device and fsdp "
               "only, not ", name);
  KOLO_REQUIRE(!options_.commHook || kind == StrategyKind::MultiWorkerMirrored,
               "DataParallelOptions::commHook needs the strategy multi-worker-mirrored (one reducer "
               "per rank), not ", name);
  // fsdp clips inside its step; one-device clips in step() below.
  options_.strategy.clipNorm = kind == StrategyKind::FullyShardedDataParallel ? options_.clipNorm : 0.0;
  if (options_.balanceBatch > 0) {
    KOLO_REQUIRE(kind == StrategyKind::MultiWorkerMirrored && options_.strategy.communicator,
                 "DataParallelOptions::balanceBatch is available with the strategy "
                 "multi-worker-mirrored over a communicator, not ", name);
    const auto& comm = options_.strategy.communicator;
    balancer_ = std::make_unique<parallel::Balancer>(options_.balanceBatch, comm->rank(),
                                                     comm->size(), options_.balancer);
  }
  if (options_.recompute) model = recomputed(std::move(model));
  parallel::LossFn loss = options_.loss;
  if (balancer_) loss = balancer_->weightedLoss(loss);
  strategy_ = parallel::makeStrategy(options_.strategy, std::move(model), std::move(optimizer),
                                     std::move(loss));
  if (options_.commHook) strategy_->reducer()->registerCommHook(options_.commHook);
}

DataParallelEngine::~DataParallelEngine() = default;

double DataParallelEngine::step(const data::Batch& batch, double lr) {
  if (options_.clipNorm > 0.0 && strategy_->kind() == StrategyKind::OneDevice) {
    // The update needs the clipped gradients (fsdp clips inside its step).
    nn::Module& net = model();
    net.train(true);
    optimizer().zeroGrad();
    const int micro = strategy_->accumulate();
    double lossSum = 0.0;
    for (int m = 0; m < micro; ++m) {
      const int64_t rows = batch.inputs.size(0);
      const Tensor x = batch.inputs.slice(0, rows * m / micro, rows * (m + 1) / micro);
      const Tensor y = batch.labels.slice(0, rows * m / micro, rows * (m + 1) / micro);
      Tensor loss = options_.loss ? options_.loss(net, x, y) : crossEntropy(net.forward(x), y);
      lossSum += loss.item();
      if (micro > 1) loss = loss * (1.0 / micro);
      loss.backward();
    }
    std::vector<Tensor> parameters;
    for (auto& [name, parameter] : net.namedParameters()) parameters.push_back(parameter);
    optim::clipGradNorm(parameters, options_.clipNorm);
    optimizer().setLr(lr);
    optimizer().step();
    return lossSum / micro;
  }
  strategy_->setLr(lr);
  if (balancer_) {
    const data::Batch share = detail::shareOf(batch, balancer_->offset(), balancer_->share());
    return strategy_->trainStep(share.inputs, share.labels).loss;
  }
  return strategy_->trainStep(batch.inputs, batch.labels).loss;
}

EvaluateResult DataParallelEngine::evaluate(const data::Dataset& dataset,
                                            EvaluateOptions options) {
  strategy_->gatherModel();  // fsdp: whole parameters for the forward passes
  options.communicator = options_.strategy.communicator;
  const EvaluateResult result = train::evaluate(model(), dataset, options);
  model().train(true);
  return result;
}

void DataParallelEngine::setAccumulate(int microBatches) {
  KOLO_REQUIRE(microBatches == 1 || !balancer_, "balancing does not accumulate gradients over micro-batches "
               "(accumulate ", microBatches, ")");
  strategy_->setAccumulate(microBatches);
}

DataShard DataParallelEngine::dataShard() const {
  // Balanced: every rank reads the whole global batch and trains on its share of it.
  if (balancer_) return {0, 1};
  return {strategy_->dataRank(), strategy_->dataWorldSize()};
}

nn::Module& DataParallelEngine::model() { return strategy_->model(); }
void DataParallelEngine::gatherModel() { strategy_->gatherModel(); }
double DataParallelEngine::lr() const { return strategy_->optimizer().lr(); }
std::shared_ptr<comm::Communicator> DataParallelEngine::communicator() const {
  return options_.strategy.communicator;
}
std::string DataParallelEngine::name() const { return strategy_->name(); }
int DataParallelEngine::replicas() const { return strategy_->replicas(); }
std::string DataParallelEngine::algorithm() const {
  return comm::algorithmName(options_.strategy.reducer.collective.algorithm);
}
observe::Fields DataParallelEngine::describe() const {
  const parallel::Reducer* reducer = strategy_->reducer();
  return {{"update", reducer && reducer->sharded() ? "sharded" : "whole"}};
}
const parallel::Reducer* DataParallelEngine::reducer() const { return strategy_->reducer(); }
parallel::Balancer* DataParallelEngine::balancer() { return balancer_.get(); }
parallel::Strategy& DataParallelEngine::strategy() { return *strategy_; }
optim::Optimizer& DataParallelEngine::optimizer() { return strategy_->optimizer(); }

StateDict DataParallelEngine::stateDict() {
  strategy_->consolidateState();
  StateDict state;
  state.tensors =
      detail::gatherCompressionState(options_.strategy.communicator.get(), *strategy_);
  if (!isPrimary()) return state;
  state.weights = model().stateDict();
  const optim::Optimizer& optimizer = strategy_->checkpointOptimizer();
  state.optimizerKind = optimizer.kind();
  state.optimizer = optimizer.stateDict();
  state.metadata = {{"strategy", strategy_->name()},
                    {"replicas", std::to_string(strategy_->replicas())}};
  return state;
}

void DataParallelEngine::loadStateDict(const StateDict& state) {
  const std::shared_ptr<comm::Communicator>& comm = options_.strategy.communicator;
  strategy_->gatherModel();  // fsdp: whole parameters to load into (collective)
  // Rank 0 loads and tells every rank whether it could before the state moves.
  detail::loadOnRankZero(comm.get(), rank(), [&] {
    // By name, strictly: every tensor of the model and nothing else, shapes alike
    // (InvalidArgument listing what differs).
    checkpoint::SafetensorsFile saved{state.weights, {}};
    checkpoint::copyIntoTensors(saved, model().stateDict(), true, "the checkpoint's weights");
    optim::Optimizer& optimizer = strategy_->checkpointOptimizer();
    if (state.optimizerKind.empty())
      KOLO_THROW(Mismatch, "checkpoint: it holds no optimizer state, this run's optimizer is ",
                 optimizer.kind());
    if (state.optimizerKind != optimizer.kind())
      KOLO_THROW(Mismatch, "checkpoint: it holds ", state.optimizerKind,
                 " optimizer state, this run's optimizer is ", optimizer.kind());
    optimizer.loadStateDict(parallel::conformStateShapes(state.optimizer, optimizer));
  }, "load the checkpoint's state");
  strategy_->syncReplicas();
  NamedTensors hookState;
  for (const auto& [name, tensor] : state.tensors)
    if (name.rfind(kHookPrefix, 0) == 0) hookState.emplace_back(name, tensor);
  detail::scatterCompressionState(comm.get(), *strategy_, hookState);
}

}  // namespace kolo::train
