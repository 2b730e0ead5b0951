// The four synchronous strategies: OneDevice, Mirrored (replica threads + in-process
// reducers), MultiWorkerMirrored (one replica per rank, Reducer over the communicator) and
// CentralStorage (replicas alias the central variables; gradients summed centrally).
#include <cstring>
#include <optional>

#include "kolo/error.h"
#include "kolo/ops.h"
#include "kolo/trace.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/fsdp.h"
#include "kolo/parallel/strategy.h"
#include "kolo/parallel/sync_batch_norm.h"
#include "parallel/data/replica_pool.h"

namespace kolo::parallel {

const char* strategyKindName(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::OneDevice:
      return "one-device";
    case StrategyKind::Mirrored:
      return "mirrored";
    case StrategyKind::MultiWorkerMirrored:
      return "multi-worker-mirrored";
    case StrategyKind::CentralStorage:
      return "central-storage";
    case StrategyKind::FullyShardedDataParallel:
      return "fsdp";
  }
  return "?";
}

StrategyKind parseStrategyKind(const std::string& name) {
  if (name == "one-device") return StrategyKind::OneDevice;
  if (name == "mirrored") return StrategyKind::Mirrored;
  if (name == "multi-worker-mirrored") return StrategyKind::MultiWorkerMirrored;
  if (name == "central-storage") return StrategyKind::CentralStorage;
  if (name == "fsdp") return StrategyKind::FullyShardedDataParallel;
  KOLO_THROW(InvalidArgument, "unknown strategy '", name,
             "' (expected one-device, mirrored, multi-worker-mirrored, central-storage or fsdp)");
}

StrategyOptions strategyOptionsFromNames(const std::string& strategy, int replicas,
                                         const std::string& reduction, const std::string& algorithm,
                                         std::shared_ptr<comm::Communicator> communicator) {
  StrategyOptions options;
  options.kind = parseStrategyKind(strategy);
  KOLO_REQUIRE(replicas >= 1, "StrategyOptions::replicas must be at least 1, got ", replicas);
  options.replicas = replicas;
  options.reduction = parseLocalReduction(reduction);
  options.reducer.collective.algorithm = comm::parseAlgorithm(algorithm);
  if (options.kind == StrategyKind::MultiWorkerMirrored ||
      options.kind == StrategyKind::FullyShardedDataParallel)
    KOLO_REQUIRE(communicator != nullptr, strategy, " needs the job's communicator");
  options.communicator = std::move(communicator);
  return options;
}

void Strategy::setAccumulate(int microBatches) {
  KOLO_REQUIRE(microBatches >= 1, name(), ": accumulate must be at least 1 micro-batch, got ", microBatches);
  accumulate_ = microBatches;
}

namespace {

// The default LossFn: kolo::crossEntropy of model(inputs) against labels.
Tensor crossEntropyOfModel(nn::Module& model, const Tensor& inputs, const Tensor& labels) {
  trace::Scope span("forward", "compute");
  return crossEntropy(model.forward(inputs), labels);
}

// loss.backward() as a timeline span.
void backward(Tensor& loss) {
  trace::Scope span("backward", "compute");
  loss.backward();
}

// Rows [r*b/k, (r+1)*b/k) of a batch, contiguous.
Tensor shard(const Tensor& t, int r, int k) {
  const int64_t b = t.size(0);
  return t.slice(0, b * r / k, b * (r + 1) / k).contiguous();
}

void checkShardable(const Tensor& inputs, const Tensor& labels, int k, int microBatches, const char* who) {
  KOLO_REQUIRE(inputs.defined() && labels.defined(), who, ": undefined batch");
  KOLO_REQUIRE(inputs.size(0) == labels.size(0), who, ": a batch of ", inputs.size(0),
               " inputs and ", labels.size(0), " labels");
  KOLO_REQUIRE(inputs.size(0) % k == 0, who, ": batch of ", inputs.size(0),
               " samples does not split evenly over ", k, " replicas");
  KOLO_REQUIRE(inputs.size(0) % (k * microBatches) == 0, who, ": batch of ", inputs.size(0),
               " samples does not split evenly over ", k, " replica(s) x ", microBatches,
               " micro-batches of accumulation");
}

// One replica's forward and backward over its rows, in `microBatches` equal parts when it
// accumulates: each part's mean loss is scaled by 1/microBatches before its backward, so the
// gradients add up to those of the rows' mean loss. With a reducer, every backward but the
// last runs in its noSync scope, and the last one carries the rows' mean loss: the gradients
// travel once, summed, during the last backward. Returns the rows' mean loss.
double forwardBackward(const LossFn& lossOf, nn::Module& model, const Tensor& inputs, const Tensor& labels,
                       int microBatches, Reducer* reducer) {
  if (microBatches == 1) {
    if (reducer) reducer->prepareForBackward();
    Tensor loss = lossOf(model, inputs, labels);
    const double value = loss.item();
    if (reducer) reducer->setLocalLoss(value);
    backward(loss);
    return value;
  }
  double sum = 0.0;
  for (int m = 0; m < microBatches; ++m) {
    const bool last = m + 1 == microBatches;
    std::optional<Reducer::NoSyncGuard> local;
    if (reducer && !last) local.emplace(*reducer);
    if (reducer && last) reducer->prepareForBackward();
    const Tensor loss = lossOf(model, shard(inputs, m, microBatches), shard(labels, m, microBatches));
    sum += loss.item();
    if (reducer && last) reducer->setLocalLoss(sum / microBatches);
    Tensor scaled = loss * (1.0 / microBatches);
    backward(scaled);
  }
  return sum / microBatches;
}

void copyTensors(const NamedTensors& from, const NamedTensors& to) {
  KOLO_CHECK_EQ(from.size(), to.size(), "replicas disagree on the number of parameters or buffers");
  for (size_t i = 0; i < from.size(); ++i) Tensor(to[i].second).copyFrom(from[i].second);
}

// Parameters and buffers of one replica into another of the same model.
void copyState(const nn::Module& from, const nn::Module& to) {
  copyTensors(from.stateDict(), to.stateDict());
}

class OneDeviceStrategy : public Strategy {
 public:
  OneDeviceStrategy(ModelFactory models, OptimizerFactory optimizers, LossFn loss)
      : model_(models()), loss_(std::move(loss)) {
    optimizer_ = optimizers(model_->namedParameters());
  }
  StrategyKind kind() const override { return StrategyKind::OneDevice; }
  int localReplicas() const override { return 1; }
  StepResult trainStep(const Tensor& inputs, const Tensor& labels) override {
    checkShardable(inputs, labels, 1, accumulate_, "one-device");
    optimizer_->zeroGrad();
    const double loss = forwardBackward(loss_, *model_, inputs, labels, accumulate_, nullptr);
    {
      trace::Scope span("optimizer", "compute");
      optimizer_->step();
    }
    return {loss};
  }
  nn::Module& model() override { return *model_; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  void syncReplicas() override {}

 private:
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  LossFn loss_;
};

// TensorFlow's MirroredStrategy: every replica keeps its own copy of the variables and its
// own optimizer; gradients are all-reduced in process, so every replica applies the same
// update and the copies stay bit-identical.
class MirroredStrategy : public Strategy {
 public:
  MirroredStrategy(const StrategyOptions& options, ModelFactory models, OptimizerFactory optimizers,
                   LossFn loss)
      : k_(options.replicas), loss_(std::move(loss)), pool_(options.replicas) {
    auto comms = makeReplicaGroup(k_, options.reduction);
    models_.resize(k_);
    optimizers_.resize(k_);
    reducers_.resize(k_);
    for (int r = 0; r < k_; ++r) {
      models_[r] = models();
      if (options.syncBatchNorm) convertSyncBatchNorm(*models_[r], comms[r]);
    }
    // The reducers broadcast replica 0's weights; their construction is collective.
    pool_.run([&](int r) {
      reducers_[r] = std::make_unique<Reducer>(*models_[r], comms[r], options.reducer);
      optimizers_[r] = optimizers(models_[r]->namedParameters());
    });
  }
  StrategyKind kind() const override { return StrategyKind::Mirrored; }
  int localReplicas() const override { return k_; }
  StepResult trainStep(const Tensor& inputs, const Tensor& labels) override {
    checkShardable(inputs, labels, k_, accumulate_, "mirrored");
    pool_.run([&](int r) {
      Reducer& reducer = *reducers_[r];
      try {
        optimizers_[r]->zeroGrad();
        forwardBackward(loss_, *models_[r], shard(inputs, r, k_), shard(labels, r, k_), accumulate_, &reducer);
        reducer.finalize();
        optimizers_[r]->step();
      } catch (const std::exception& e) {
        // The other replicas would wait for this one in the next collective: release them.
        abortReplicaGroup(reducer.communicator(), e.what());
        throw;
      }
    });
    return {reducers_[0]->globalLoss()};
  }
  nn::Module& model() override { return *models_[0]; }
  optim::Optimizer& optimizer() override { return *optimizers_[0]; }
  void setLr(double lr) override {
    for (auto& o : optimizers_) o->setLr(lr);
  }
  void syncReplicas() override {
    const auto state = optimizers_[0]->stateDict();
    for (int r = 1; r < k_; ++r) {
      copyState(*models_[0], *models_[r]);
      optimizers_[r]->loadStateDict(conformStateShapes(state, *optimizers_[r]));
    }
  }
  Reducer* reducer() override { return reducers_[0].get(); }

 private:
  int k_;
  LossFn loss_;
  detail::ReplicaPool pool_;
  std::vector<std::shared_ptr<nn::Module>> models_;
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers_;
  std::vector<std::unique_ptr<Reducer>> reducers_;
};

// One replica per rank; the Reducer all-reduces its gradient buckets during backward.
class MultiWorkerMirroredStrategy : public Strategy {
 public:
  MultiWorkerMirroredStrategy(const StrategyOptions& options, ModelFactory models,
                              OptimizerFactory optimizers, LossFn loss)
      : comm_(options.communicator), model_(models()), loss_(std::move(loss)) {
    if (options.syncBatchNorm) convertSyncBatchNorm(*model_, comm_);
    reducer_ = std::make_unique<Reducer>(*model_, comm_, options.reducer);
    optimizer_ = optimizers(model_->namedParameters());
  }
  StrategyKind kind() const override { return StrategyKind::MultiWorkerMirrored; }
  int localReplicas() const override { return 1; }
  int dataRank() const override { return comm_->rank(); }
  int dataWorldSize() const override { return comm_->size(); }
  StepResult trainStep(const Tensor& inputs, const Tensor& labels) override {
    checkShardable(inputs, labels, 1, accumulate_, "multi-worker-mirrored");
    optimizer_->zeroGrad();
    forwardBackward(loss_, *model_, inputs, labels, accumulate_, reducer_.get());
    reducer_->step(*optimizer_);
    return {reducer_->globalLoss()};
  }
  void consolidateState() override { reducer_->consolidateOptimizerState(*optimizer_); }
  nn::Module& model() override { return *model_; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  void syncReplicas() override {
    broadcastParameters(*model_, *comm_, 0);
    broadcastOptimizerState(*optimizer_, *comm_, 0);
  }
  Reducer* reducer() override { return reducer_.get(); }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  std::shared_ptr<nn::Module> model_;
  LossFn loss_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

// TensorFlow's CentralStorageStrategy: the variables exist once (the central model); each
// replica's parameters are views of the same storage, so replicas read the central values
// directly. Replica gradients are summed in the central place in replica order and
// averaged, and one optimizer updates the central variables. Buffers are not shared (the
// replicas' forwards would race on them): each step copies the central ones into every
// replica and replica 0's back, as data parallelism keeps replica 0's.
class CentralStorageStrategy : public Strategy {
 public:
  CentralStorageStrategy(const StrategyOptions& options, ModelFactory models,
                         OptimizerFactory optimizers, LossFn loss)
      : k_(options.replicas), central_(models()), loss_(std::move(loss)), pool_(options.replicas) {
    optimizer_ = optimizers(central_->namedParameters());
    const NamedTensors central = central_->namedParameters();
    for (int r = 0; r < k_; ++r) {
      auto replica = models();
      const NamedTensors params = replica->namedParameters();
      KOLO_CHECK_EQ(params.size(), central.size(), "central-storage: replica ", r,
                    " has another parameter count");
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor& c = central[i].second;
        const Tensor& p = params[i].second;
        KOLO_CHECK(p.shape() == c.shape() && p.dtype() == c.dtype() && c.isContiguous(),
                   "central-storage: parameter '", params[i].first, "' of replica ", r, " is ",
                   shapeString(p.shape()), " but the central one is ", shapeString(c.shape()));
        // Alias the storage: the replica computes with the central variable itself.
        p.impl()->storage = c.impl()->storage;
        p.impl()->offset = c.impl()->offset;
        p.impl()->strides = c.impl()->strides;
      }
      replicas_.push_back(std::move(replica));
    }
    if (options.syncBatchNorm) {
      // The replicas' threads sum their batch norms' statistics in a group of their own.
      const auto group = makeReplicaGroup(k_);
      for (int r = 0; r < k_; ++r) convertSyncBatchNorm(*replicas_[r], group[r]);
    }
    losses_.assign(k_, 0.0);
  }
  StrategyKind kind() const override { return StrategyKind::CentralStorage; }
  int localReplicas() const override { return k_; }
  StepResult trainStep(const Tensor& inputs, const Tensor& labels) override {
    checkShardable(inputs, labels, k_, accumulate_, "central-storage");
    const NamedTensors centralBuffers = central_->namedBuffers();
    for (auto& replica : replicas_) copyTensors(centralBuffers, replica->namedBuffers());
    pool_.run([&](int r) {
      replicas_[r]->zeroGrad();
      losses_[r] = forwardBackward(loss_, *replicas_[r], shard(inputs, r, k_), shard(labels, r, k_), accumulate_,
                                   nullptr);
    });
    // Reduce into the central gradients: sum over replicas in order, then average.
    const NamedTensors central = central_->namedParameters();
    std::vector<NamedTensors> replicaParams;
    for (auto& m : replicas_) replicaParams.push_back(m->namedParameters());
    for (size_t i = 0; i < central.size(); ++i) {
      Tensor c = central[i].second;
      KOLO_CHECK(c.dtype() == DType::F32, "central-storage: parameter '", central[i].first,
                 "' is not f32");
      Tensor g = c.grad();
      if (!g.defined() || !g.isContiguous()) {
        g = Tensor::zeros(c.shape());
        c.setGrad(g);
      }
      float* dst = g.data<float>();
      const int64_t n = c.numel();
      for (int r = 0; r < k_; ++r) {
        Tensor rg = replicaParams[r][i].second.grad();
        KOLO_CHECK(rg.defined(), "central-storage: parameter '", central[i].first,
                   "' got no gradient on replica ", r);
        Tensor src = rg.contiguous();
        const float* s = src.data<float>();
        if (r == 0)
          std::memcpy(dst, s, sizeof(float) * n);
        else
          for (int64_t j = 0; j < n; ++j) dst[j] += s[j];
      }
      const float scale = 1.0f / static_cast<float>(k_);
      for (int64_t j = 0; j < n; ++j) dst[j] *= scale;
    }
    optimizer_->step();
    copyTensors(replicas_[0]->namedBuffers(), centralBuffers);
    double mean = 0;
    for (double l : losses_) mean += l;
    return {mean / k_};
  }
  nn::Module& model() override { return *central_; }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  void syncReplicas() override {}  // replicas alias the central variables

 private:
  int k_;
  std::shared_ptr<nn::Module> central_;
  LossFn loss_;
  detail::ReplicaPool pool_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;
  std::vector<double> losses_;
};

}  // namespace

std::unique_ptr<Strategy> makeStrategy(const StrategyOptions& options, ModelFactory modelFactory,
                                       OptimizerFactory optimizerFactory, LossFn loss) {
  KOLO_CHECK(modelFactory != nullptr, "makeStrategy: no model factory");
  KOLO_CHECK(optimizerFactory != nullptr, "makeStrategy: no optimizer factory");
  if (!loss) loss = crossEntropyOfModel;
  switch (options.kind) {
    case StrategyKind::OneDevice:
      return std::make_unique<OneDeviceStrategy>(std::move(modelFactory),
                                                 std::move(optimizerFactory), std::move(loss));
    case StrategyKind::Mirrored:
      KOLO_REQUIRE(options.replicas >= 1, "mirrored needs at least one replica, got ",
                   options.replicas);
      return std::make_unique<MirroredStrategy>(options, std::move(modelFactory),
                                                std::move(optimizerFactory), std::move(loss));
    case StrategyKind::MultiWorkerMirrored:
      KOLO_REQUIRE(options.communicator != nullptr, "multi-worker-mirrored needs a communicator");
      return std::make_unique<MultiWorkerMirroredStrategy>(
          options, std::move(modelFactory), std::move(optimizerFactory), std::move(loss));
    case StrategyKind::CentralStorage:
      KOLO_REQUIRE(options.replicas >= 1, "central-storage needs at least one replica, got ",
                   options.replicas);
      return std::make_unique<CentralStorageStrategy>(options, std::move(modelFactory),
                                                      std::move(optimizerFactory), std::move(loss));
    case StrategyKind::FullyShardedDataParallel:
      if (options.syncBatchNorm)
        modelFactory = [models = std::move(modelFactory), comm = options.communicator] {
          std::shared_ptr<nn::Module> model = models();
          convertSyncBatchNorm(*model, comm);
          return model;
        };
      return makeFsdpStrategy(options.communicator,
                              {.shard = options.shard,
                               .collective = options.reducer.collective,
                               .shardGroup = options.shardGroup,
                               .clipNorm = options.clipNorm,
                               .unitMinParameters = options.unitMinParameters},
                              std::move(modelFactory), std::move(optimizerFactory), std::move(loss));
  }
  KOLO_THROW(InvalidArgument, "makeStrategy: unknown strategy kind");
}

}  // namespace kolo::parallel
