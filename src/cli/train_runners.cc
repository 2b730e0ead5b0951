// The runners of train_runners.h: a pipeline stage and a tensor-parallel shard, each stepping
// alone or as a replica whose gradients its data group averages, and fsdp over the whole job.
#include "cli/train_runners.h"

#include <chrono>

#include "kolo/memory.h"
#include "kolo/parallel/mesh.h"

namespace kolo::cli {
namespace {

ModelPart partOf(nn::Module& module, optim::Optimizer& optimizer,
                 const parallel::TensorParallelModel* tp) {
  ModelPart part;
  part.module = &module;
  part.optimizer = &optimizer;
  if (tp) {
    part.specs = tp->shardSpecs();
    part.tensorRank = tp->communicator()->rank();
    part.tensorSize = tp->communicator()->size();
  }
  return part;
}

// The loss averaged over the data group (the replicas' shares of the batch are equal).
double meanOverReplicas(double loss, comm::Communicator* data) {
  if (data && data->size() > 1) data->allreduce(&loss, &loss, 1, DType::F64, comm::ReduceOp::Avg);
  return loss;
}

class PipelineRunner : public Runner {
 public:
  /// `tp`: the tensor-parallel model the stage was cut from (a mesh with tp > 1), or null.
  PipelineRunner(std::unique_ptr<parallel::PipelineStage> stage,
                 std::shared_ptr<comm::Communicator> data,
                 std::shared_ptr<parallel::TensorParallelModel> tp)
      : stage_(std::move(stage)), data_(std::move(data)), tp_(std::move(tp)) {}
  parallel::PipelineStepStats trainStep(const Tensor& x, const Tensor& y) override {
    if (!data_) return stage_->trainStep(x, y);
    // A replica of a hybrid: its gradients are averaged with the same stage of the others.
    const auto start = std::chrono::steady_clock::now();
    stage_->optimizer().zeroGrad();
    parallel::PipelineStepStats stats = stage_->forwardBackward(x, y);
    const auto update = std::chrono::steady_clock::now();
    parallel::averageGradients(stage_->module(), *data_);
    stage_->optimizer().step();
    stats.loss = meanOverReplicas(stats.loss, data_.get());
    stats.computeSeconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - update).count();
    stats.stepSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }
  optim::Optimizer& optimizer() override { return stage_->optimizer(); }
  std::vector<int> bounds() const override { return stage_->bounds(); }
  ModelPart part() override { return partOf(stage_->module(), stage_->optimizer(), tp_.get()); }

 private:
  std::unique_ptr<parallel::PipelineStage> stage_;
  std::shared_ptr<comm::Communicator> data_;
  std::shared_ptr<parallel::TensorParallelModel> tp_;
};

// Every rank runs the whole batch through its shard of every split layer.
class TensorRunner : public Runner {
 public:
  TensorRunner(std::shared_ptr<comm::Communicator> comm, const nn::Sequential& whole,
               parallel::TensorParallelOptions options, const Recipe& recipe,
               std::shared_ptr<comm::Communicator> data)
      : model_(std::make_unique<parallel::TensorParallelModel>(whole, std::move(comm), options)),
        optimizer_(makeOptimizer(recipe, model_->namedParameters())),
        data_(std::move(data)),
        layers_(static_cast<int>(whole.size())) {}
  parallel::PipelineStepStats trainStep(const Tensor& x, const Tensor& y) override {
    parallel::PipelineStepStats stats;
    const auto start = std::chrono::steady_clock::now();
    const int64_t base = liveTensorBytes();
    resetPeakTensorBytes();
    optimizer_->zeroGrad();
    Tensor loss = model_->loss(model_->forward(x), y);
    loss.backward();
    stats.peakStepBytes = peakTensorBytes() - base;
    if (data_) parallel::averageGradients(*model_, *data_);
    optimizer_->step();
    stats.loss = meanOverReplicas(loss.item(), data_.get());
    stats.peakMicroBatchesHeld = 1;
    stats.stepSeconds = stats.computeSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  std::vector<int> bounds() const override { return {0, layers_}; }
  ModelPart part() override { return partOf(*model_, *optimizer_, model_.get()); }

 private:
  std::unique_ptr<parallel::TensorParallelModel> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<comm::Communicator> data_;  // the data group of a hybrid, else null
  int layers_;
};

// Fully sharded data parallelism over every rank of the job.
class FsdpRunner : public Runner {
 public:
  FsdpRunner(std::shared_ptr<comm::Communicator> comm, std::shared_ptr<nn::Sequential> model,
             parallel::StageLossFn loss, const Recipe& recipe, parallel::FsdpOptions options)
      : comm_(comm), layers_(static_cast<int>(model->size())) {
    KOLO_CHECK(model != nullptr, "fsdp: no model");
    strategy_ = parallel::makeFsdpStrategy(
        std::move(comm), options, [model] { return model; },
        [recipe](const parallel::NamedTensors& p) { return makeOptimizer(recipe, p); },
        [loss](nn::Module& m, const Tensor& x, const Tensor& y) { return loss(m.forward(x), y); });
  }
  parallel::PipelineStepStats trainStep(const Tensor& x, const Tensor& y) override {
    parallel::PipelineStepStats stats;
    const auto start = std::chrono::steady_clock::now();
    const int64_t rows = x.size(0) / comm_->size();
    const int64_t from = rows * comm_->rank();
    const int64_t base = liveTensorBytes();
    resetPeakTensorBytes();
    stats.loss = strategy_->trainStep(x.slice(0, from, from + rows).contiguous(),
                                      y.slice(0, from, from + rows).contiguous())
                     .loss;
    stats.peakStepBytes = peakTensorBytes() - base;
    stats.peakMicroBatchesHeld = 1;
    stats.stepSeconds = stats.computeSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }
  optim::Optimizer& optimizer() override { return strategy_->optimizer(); }
  int64_t parameterCount() override {
    int64_t count = 0;  // the elements of this rank's shards
    for (const auto& [name, piece] : strategy_->optimizer().parameters()) count += piece.numel();
    return count;
  }
  std::vector<int> bounds() const override { return {0, layers_}; }
  // Every rank holds the whole model once gathered (gatherWhole).
  ModelPart part() override { return {&strategy_->model(), {}, &strategy_->optimizer()}; }
  ModelPart statePart() override {
    strategy_->consolidateState();
    return {&strategy_->model(), {}, &strategy_->checkpointOptimizer()};
  }
  void stateLoaded() override { strategy_->syncReplicas(); }
  void gatherWhole() override { strategy_->gatherModel(); }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  std::unique_ptr<parallel::Strategy> strategy_;
  int layers_;
};

}  // namespace

std::unique_ptr<Runner> makePipelineRunner(std::unique_ptr<parallel::PipelineStage> stage,
                                           std::shared_ptr<comm::Communicator> data,
                                           std::shared_ptr<parallel::TensorParallelModel> tp) {
  return std::make_unique<PipelineRunner>(std::move(stage), std::move(data), std::move(tp));
}

std::unique_ptr<Runner> makeTensorRunner(std::shared_ptr<comm::Communicator> comm,
                                         const nn::Sequential& whole,
                                         parallel::TensorParallelOptions options,
                                         const Recipe& recipe,
                                         std::shared_ptr<comm::Communicator> data) {
  return std::make_unique<TensorRunner>(std::move(comm), whole, options, recipe, std::move(data));
}

std::unique_ptr<Runner> makeFsdpRunner(std::shared_ptr<comm::Communicator> comm,
                                       std::shared_ptr<nn::Sequential> model, parallel::StageLossFn loss,
                                       const Recipe& recipe, parallel::FsdpOptions options) {
  return std::make_unique<FsdpRunner>(std::move(comm), std::move(model), std::move(loss), recipe, options);
}

}  // namespace kolo::cli
