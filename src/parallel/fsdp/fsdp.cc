// Fully sharded data parallelism: units (top-level children) with flat, padded parameter
// buffers; per-unit gather before forward and backward (ZeRO-3), per-unit reduce-scatter of
// the gradients as soon as backward finished them (then, under HSDP, an all-reduce across the
// shard groups), and an optimizer over this rank's shards.
#include "kolo/parallel/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "fsdp_unit.h"
#include "kolo/autograd.h"
#include "kolo/comm/init.h"
#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/parallel/distributed.h"
#include "kolo/trace.h"

namespace kolo::parallel {

const char* shardLevelName(ShardLevel level) {
  return level == ShardLevel::Gradients ? "grad" : "full";
}

ShardLevel parseShardLevel(const std::string& name) {
  if (name == "grad") return ShardLevel::Gradients;
  if (name == "full") return ShardLevel::Full;
  KOLO_THROW(InvalidArgument, "fsdp: shard level '", name, "' is not accepted: use grad or full");
}

namespace {

Tensor crossEntropyOfModel(nn::Module& model, const Tensor& inputs, const Tensor& labels) {
  trace::Scope span("forward", "compute");
  return crossEntropy(model.forward(inputs), labels);
}

using Unit = detail::FsdpUnit;
using Piece = detail::FsdpPiece;

class FsdpStrategy : public Strategy {
 public:
  FsdpStrategy(std::shared_ptr<comm::Communicator> world, FsdpOptions options, ModelFactory models,
               OptimizerFactory optimizers, LossFn loss)
      : world_(std::move(world)),
        options_(options),
        optimizers_(std::move(optimizers)),
        loss_(std::move(loss)) {
    KOLO_REQUIRE(world_ != nullptr, "fsdp needs the job's communicator");
    KOLO_REQUIRE(options_.clipNorm >= 0.0, "fsdp: clip norm ", options_.clipNorm, " is negative");
    model_ = models();
    KOLO_CHECK(model_ != nullptr, "fsdp: the model factory returned no model");
    splitGroups();
    broadcastParameters(*model_, *world_, 0);
    buildUnits();
    buildShardOptimizer();
    installHooks();
    keepGathered_ = false;
    for (Unit& unit : units_) release(unit);
  }

  StrategyKind kind() const override { return StrategyKind::FullyShardedDataParallel; }
  int localReplicas() const override { return 1; }
  int dataRank() const override { return world_->rank(); }
  int dataWorldSize() const override { return world_->size(); }
  // Gradient accumulation (Strategy::setAccumulate, the base's): every micro-batch's backward
  // reduce-scatters each unit's gradients as a step without it does, and the shard adds them
  // to what the earlier micro-batches left (each loss scaled by 1/K), so gradients stay
  // sharded between micro-batches; the price is K reduce-scatters a step (and, under ZeRO-3,
  // K gathers), as PyTorch FSDP accumulates outside no_sync. Keeping the whole gradients
  // until the last micro-batch (no_sync) would send them once but hold a whole model's
  // gradients, which is what sharding is for not holding.
  StepResult trainStep(const Tensor& inputs, const Tensor& labels) override {
    KOLO_REQUIRE(inputs.defined() && labels.defined(), "fsdp: undefined batch");
    KOLO_REQUIRE(inputs.size(0) == labels.size(0), "fsdp: a batch of ", inputs.size(0),
                 " inputs and ", labels.size(0), " labels");
    const int micro = accumulate_;
    KOLO_REQUIRE(inputs.size(0) % micro == 0, "fsdp: batch of ", inputs.size(0),
                 " samples does not split evenly over ", micro, " micro-batches of accumulation");
    keepGathered_ = false;
    whole_.reset();  // a checkpoint's whole optimizer state is not kept between steps
    double local = 0.0;
    for (int m = 0; m < micro; ++m) {
      microBatch_ = m;
      const int64_t rows = inputs.size(0), begin = rows * m / micro, end = rows * (m + 1) / micro;
      const Tensor x = micro == 1 ? inputs : inputs.slice(0, begin, end).contiguous();
      const Tensor y = micro == 1 ? labels : labels.slice(0, begin, end).contiguous();
      local += forwardBackward(x, y, micro);
    }
    microBatch_ = 0;
    local /= micro;
    if (options_.clipNorm > 0.0) clipGradients();
    double sum = 0;
    world_->allreduce(&local, &sum, 1, DType::F64, comm::ReduceOp::Sum, options_.collective);
    {
      trace::Scope span("optimizer", "compute");
      optimizer_->step();
    }
    // The averaged gradients are spent: their shards hold no memory until the next backward
    // reduce-scatters into them (the optimizer's pieces view them).
    for (Unit& unit : units_) emptyStorage(*unit.gradShard.impl()->storage);
    if (options_.shard == ShardLevel::Gradients)
      for (Unit& unit : units_) allGather(unit);
    return {sum / world_->size()};
  }

  nn::Module& model() override { return *model_; }
  // One micro-batch's forward and backward (its loss scaled by 1/micro) and every unit's
  // reduce-scatter; returns its mean loss.
  double forwardBackward(const Tensor& inputs, const Tensor& labels, int micro) {
    for (Unit& unit : units_) {
      release(unit);
      unit.ready = 0;
      unit.reduced = false;
      unit.gradFlat = Tensor();
      unit.referencesBeforeForward = references(unit);
      unit.readInBackward = true;
    }
    // The first forward records the order in which it reaches the units; later ones
    // prefetch along it (PyTorch FSDP's forward-order recording).
    recording_ = !orderKnown_;
    Tensor loss = loss_(*model_, inputs, labels);
    if (recording_) {
      orderKnown_ = true;
      recording_ = false;
      position_.assign(units_.size(), -1);
      for (size_t i = 0; i < forwardOrder_.size(); ++i)
        if (position_[forwardOrder_[i]] < 0) position_[forwardOrder_[i]] = static_cast<int>(i);
    }
    const double value = loss.item();
    if (micro > 1) loss = loss * (1.0 / micro);
    {
      trace::Scope span("backward", "compute");
      loss.backward();
    }
    // A unit some of whose parameters got no gradient: the missing ones count as zeros.
    for (Unit& unit : units_)
      if (!unit.reduced) reduceScatter(unit);
    return value;
  }

  optim::Optimizer& optimizer() override { return *optimizer_; }
  optim::Optimizer& checkpointOptimizer() override {
    if (!whole_) whole_ = optimizers_(model_->namedParameters());
    return *whole_;
  }
  void consolidateState() override {
    gatherModel();
    detail::assembleWholeState(units_, pieces_, *optimizer_, checkpointOptimizer(), *shard_,
                               options_.collective);
  }
  // Rank 0 loaded whole parameters (into the gathered model) and whole optimizer state: every
  // rank takes them, then keeps its shards of both.
  void syncReplicas() override {
    for (const Unit& unit : units_)
      KOLO_CHECK(unit.gathered && unit.pending.empty(), "fsdp: unit '", unit.name,
                 "' is not gathered; call gatherModel() before loading into the model");
    broadcastParameters(*model_, *world_, 0);
    broadcastOptimizerState(checkpointOptimizer(), *world_, 0);
    detail::takeShardState(units_, pieces_, *whole_, *optimizer_, shard_->rank());
    whole_.reset();
  }
  void gatherModel() override {
    for (Unit& unit : units_) gather(unit);
    keepGathered_ = true;
  }

 private:
  // HSDP: shard groups of consecutive ranks, and the replica groups that join each group's
  // rank r; without it the shard group is the whole job.
  void splitGroups() {
    const int n = world_->size();
    int group = options_.shardGroup == 0 ? n : options_.shardGroup;
    if (options_.shardGroup == kShardGroupPerHost) group = std::max(1, comm::detectLaunch().localSize);
    KOLO_REQUIRE(group >= 1 && n % group == 0, "fsdp: a shard group of ", group,
                 options_.shardGroup == kShardGroupPerHost ? " ranks (the ranks of one host)" : " ranks",
                 " does not divide the job's ", n, " ranks");
    if (group == n) {
      shard_ = world_;
      return;
    }
    const int rank = world_->rank();
    shard_ = world_->split(rank / group, rank);
    replicas_ = world_->split(rank % group, rank);
  }

  // Cuts the top-level children that hold parameters into units, in order: a unit takes
  // consecutive children until it holds at least options_.unitMinParameters parameters (each
  // child alone when that is 0). Moves each unit's parameters into its flat buffer (padding
  // zeroed) and keeps this rank's shard of it.
  void buildUnits() {
    const int n = shard_->size();
    const int rank = shard_->rank();
    size_t inUnits = 0;
    std::map<const TensorImpl*, size_t> unitOf;  // each parameter's unit
    for (const auto& [childName, child] : model_->children()) {
      NamedTensors parameters = child->namedParameters();
      if (parameters.empty()) continue;
      // A tensor that an earlier unit holds (tied embeddings): that unit through this child
      // become one, so that the tensor is gathered whenever either of its layers runs.
      size_t joinFrom = units_.size();
      for (const auto& entry : parameters)
        if (const auto at = unitOf.find(entry.second.impl()); at != unitOf.end()) joinFrom = std::min(joinFrom, at->second);
      if (joinFrom < units_.size()) {
        Unit& into = units_[joinFrom];
        for (size_t u = joinFrom + 1; u < units_.size(); ++u) {
          Unit& from = units_[u];
          into.name += "+" + from.name;
          into.modules.insert(into.modules.end(), from.modules.begin(), from.modules.end());
          for (size_t i = 0; i < from.parameters.size(); ++i) {
            into.offsets.push_back(into.numel + from.offsets[i]);
            into.parameters.push_back(from.parameters[i]);
            unitOf[from.parameters[i].second.impl()] = joinFrom;
          }
          into.numel += from.numel;
        }
        units_.resize(joinFrom + 1);
      } else if (units_.empty() || units_.back().numel >= options_.unitMinParameters) {
        units_.emplace_back();
      }
      Unit& unit = units_.back();
      unit.name += (unit.name.empty() ? "" : "+") + childName;
      unit.modules.push_back(child.get());
      for (auto& [name, p] : parameters) {
        if (unitOf.count(p.impl())) continue;  // tied: held once, under its first name
        KOLO_CHECK(p.dtype() == DType::F32, "fsdp: parameter '", childName, ".", name,
                   "' is ", dtypeName(p.dtype()), "; only f32 parameters can be sharded");
        unit.offsets.push_back(unit.numel);
        unit.numel += p.numel();
        unit.parameters.emplace_back(childName + "." + name, p);
        unitOf[p.impl()] = units_.size() - 1;
        ++inUnits;
      }
    }
    for (Unit& unit : units_) {
      unit.padded = (unit.numel + n - 1) / n * n;
      unit.shardLength = unit.padded / n;
      Tensor flat = Tensor::zeros({unit.padded});
      float* dst = flat.data<float>();
      for (size_t i = 0; i < unit.parameters.size(); ++i) {
        Tensor p = unit.parameters[i].second;
        Tensor values = p.contiguous();
        std::memcpy(dst + unit.offsets[i], values.data<float>(), sizeof(float) * p.numel());
        p.impl()->storage = flat.impl()->storage;
        p.impl()->offset = unit.offsets[i];
        p.impl()->strides = contiguousStrides(p.shape());
      }
      unit.flat = flat.impl()->storage;
      unit.shard = Tensor::empty({unit.shardLength});
      std::memcpy(unit.shard.data<float>(), dst + rank * unit.shardLength,
                  sizeof(float) * unit.shardLength);
      unit.gradShard = Tensor::zeros({unit.shardLength});
      emptyStorage(*unit.gradShard.impl()->storage);  // filled by each step's reduce-scatter
    }
    const NamedTensors all = model_->namedParameters();
    KOLO_CHECK(inUnits == all.size(), "fsdp: ", all.size() - inUnits,
               " parameter(s) belong to the root module itself; fsdp shards the parameters of "
               "its top-level children (put them in a child module)");
    KOLO_CHECK(!units_.empty(), "fsdp: the model has no parameters to shard");
  }

  // The optimizer sees, per parameter, the part of it that this rank owns: views of the
  // shard (and of the gradient shard, set once as their gradient).
  void buildShardOptimizer() {
    const int rank = shard_->rank();
    NamedTensors views;
    for (size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = units_[u];
      const int64_t begin = rank * unit.shardLength;
      const int64_t end = begin + unit.shardLength;
      for (size_t i = 0; i < unit.parameters.size(); ++i) {
        const int64_t lo = std::max(begin, unit.offsets[i]);
        const int64_t hi = std::min(end, unit.offsets[i] + unit.parameters[i].second.numel());
        if (lo >= hi) continue;
        Tensor piece = unit.shard.slice(0, lo - begin, hi - begin);
        piece.setGrad(unit.gradShard.slice(0, lo - begin, hi - begin));
        views.emplace_back(unit.parameters[i].first, piece);
        pieces_.push_back({.unit = u, .parameter = i, .lo = lo, .hi = hi});
      }
    }
    optimizer_ = optimizers_(views);
  }

  void installHooks() {
    for (size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = units_[u];
      for (nn::Module* module : unit.modules) {
        module->addForwardPreHook([this, u](nn::Module&) {
          gather(units_[u]);
          if (nn::recomputing()) return;  // backward's recomputation: no forward order, no prefetch
          if (recording_ && (forwardOrder_.empty() || forwardOrder_.back() != u))
            forwardOrder_.push_back(u);
          prefetchAfter(u, +1);
        });
        module->addOutputGradHook([this, u](nn::Module&, const Tensor&) {
          Unit& owner = units_[u];
          viewGradients(owner);
          if (owner.readInBackward) gather(owner);
          prefetchAfter(u, -1);  // backward runs the units in reverse
        });
      }
      // Forward leaves the unit after its last child's forward.
      unit.modules.back()->addForwardHook([this, u](nn::Module&, const Tensor&) {
        Unit& owner = units_[u];
        if (nn::recomputing()) {  // its backward comes next: the weights stay gathered
          owner.readInBackward = true;
          return;
        }
        // Backward can read the parameters only through a handle that a recorded node kept
        // (linear and conv2d keep the weight only when their input needs a gradient, so a
        // first layer fed by the data keeps none): without one, backward needs no gather.
        owner.readInBackward = references(owner) > owner.referencesBeforeForward;
        // The unit forward reaches last is the first that backward needs: it stays gathered
        // (PyTorch FSDP keeps the root's parameters between forward and backward alike).
        const bool backwardStartsHere =
            orderKnown_ && !forwardOrder_.empty() && forwardOrder_.back() == u;
        if (!keepGathered_ && !(backwardStartsHere && owner.readInBackward)) release(owner);
      });
      for (auto& [name, p] : unit.parameters) {
        Tensor(p).addGradReadyHook([this, u](Tensor&) {
          Unit& owner = units_[u];
          if (++owner.ready == owner.parameters.size()) reduceScatter(owner);
        });
      }
    }
  }

  // optim::clipGradNorm over the sharded gradient: each element of the averaged gradient
  // lives in exactly one shard of the group (the other groups hold the same shards), so the
  // squared norm is the group's sum of the shards' squares. Padding is zero.
  void clipGradients() {
    double squares = 0.0;
    for (const Unit& unit : units_) {
      const float* g = unit.gradShard.data<float>();
      for (int64_t j = 0; j < unit.shardLength; ++j) squares += static_cast<double>(g[j]) * g[j];
    }
    shard_->allreduce(&squares, &squares, 1, DType::F64, comm::ReduceOp::Sum, options_.collective);
    const double coefficient = options_.clipNorm / (std::sqrt(squares) + 1e-6);
    if (coefficient >= 1.0) return;
    const auto scale = static_cast<float>(coefficient);
    for (Unit& unit : units_) {
      float* g = unit.gradShard.data<float>();
      for (int64_t j = 0; j < unit.shardLength; ++j) g[j] *= scale;
    }
  }

  // The unit's whole parameters into its flat buffer (allocated now under ZeRO-3): waits for
  // its prefetched gather, or gathers it now.
  void gather(Unit& unit) {
    if (!unit.pending.empty()) {
      trace::Scope span("all-gather wait", "comm");
      for (auto& work : unit.pending) work->wait();
      unit.pending.clear();
      unit.gathered = true;
      return;
    }
    if (unit.gathered) return;
    allGather(unit);
  }

  // ZeRO-3, from the second step on: starts gathering the unit that follows `u` in the
  // recorded forward order (step +1) or precedes it (-1, for backward), so that its
  // communication runs during u's compute. The all-gather is N broadcasts, one per rank's
  // shard, started without waiting; the communicator runs them before any later collective.
  void prefetchAfter(size_t u, int step) {
    if (!options_.prefetch || options_.shard != ShardLevel::Full || !orderKnown_ ||
        keepGathered_ || position_[u] < 0)
      return;
    const int next = position_[u] + step;
    if (next < 0 || next >= static_cast<int>(forwardOrder_.size())) return;
    Unit& unit = units_[forwardOrder_[static_cast<size_t>(next)]];
    if (unit.gathered || !unit.pending.empty() || (step < 0 && !unit.readInBackward)) return;
    allocateFlat(unit);
    float* flat = reinterpret_cast<float*>(unit.flat->bytes.get());
    const int rank = shard_->rank();
    std::memcpy(flat + rank * unit.shardLength, unit.shard.data<float>(),
                sizeof(float) * static_cast<size_t>(unit.shardLength));
    for (int r = 0; r < shard_->size(); ++r)
      unit.pending.push_back(shard_->ibroadcast(flat + r * unit.shardLength,
                                               static_cast<size_t>(unit.shardLength), DType::F32,
                                               r, options_.collective));
  }

  void allocateFlat(Unit& unit) { fillStorage(*unit.flat, unit.padded); }

  // Gives `storage` (shared by every view of it) bytes for `elements` floats unless it has
  // them, counted as tensor memory like any tensor's; emptyStorage() takes them back.
  static void fillStorage(Storage& storage, int64_t elements) {
    if (storage.bytes) return;
    Tensor fresh = Tensor::empty({elements});
    storage.bytes = fresh.impl()->storage->bytes;
    storage.nbytes = fresh.impl()->storage->nbytes;
  }
  static void emptyStorage(Storage& storage) {
    storage.bytes.reset();
    storage.nbytes = 0;
  }

  void allGather(Unit& unit) {
    trace::Scope span("all-gather", "comm");
    allocateFlat(unit);
    shard_->allgather(unit.shard.data<float>(), unit.flat->bytes.get(),
                     static_cast<size_t>(unit.shardLength), DType::F32, options_.collective);
    unit.gathered = true;
  }

  // ZeRO-3: frees the unit's whole parameters (views saved for backward see the storage
  // again once gather() refills it). Under ZeRO-2 parameters stay.
  void release(Unit& unit) {
    if (options_.shard != ShardLevel::Full) return;
    if (!unit.pending.empty()) gather(unit);  // a prefetch in flight writes into the buffer
    if (!unit.gathered) return;
    emptyStorage(*unit.flat);
    unit.gathered = false;
  }

  // Handles that share the unit's parameters: its buffer's and each parameter's own. Each
  // saved view of a parameter (a node's detached operand) holds the buffer; a node that kept
  // the parameter itself holds its handle.
  long references(const Unit& unit) const {
    long count = unit.flat.use_count();
    for (const auto& [name, p] : unit.parameters) count += p.implPtr().use_count();
    return count;
  }

  // Before the unit's backward: one buffer for all its gradients, each parameter's gradient a
  // view of it standing for zeros, so that backward writes the gradients there (a Linear's
  // GEMM straight into it) and the reduce-scatter sends from it, with no second copy.
  void viewGradients(Unit& unit) {
    if (unit.gradFlat.defined() || unit.reduced) return;
    unit.gradFlat = Tensor::empty({unit.padded});
    for (size_t i = 0; i < unit.parameters.size(); ++i) {
      Tensor p = unit.parameters[i].second;
      if (p.grad().defined()) continue;  // a gradient from elsewhere already: copied later
      p.setGrad(unit.gradFlat.slice(0, unit.offsets[i], unit.offsets[i] + p.numel()).view(p.shape()));
      p.zeroGrad();
    }
  }

  // Sums the unit's gradients over the ranks into this rank's gradient shard, divides by the
  // rank count, and drops the whole gradients and (ZeRO-3) the whole parameters.
  void reduceScatter(Unit& unit) {
    trace::Scope span("reduce-scatter", "comm");
    // Once all of a unit's gradients exist, backward has run every node that read its
    // parameters: ZeRO-3 frees them before communicating.
    release(unit);
    Tensor buffer = unit.gradFlat.defined() ? unit.gradFlat : Tensor::empty({unit.padded});
    unit.gradFlat = Tensor();
    float* flat = buffer.data<float>();
    for (size_t i = 0; i < unit.parameters.size(); ++i) {
      Tensor p = unit.parameters[i].second;
      float* slot = flat + unit.offsets[i];
      const Tensor g = p.grad();  // a view that got no gradient reads as zeros here
      if (!g.defined()) {
        std::fill(slot, slot + p.numel(), 0.0f);
      } else if (g.data<float>() != slot) {
        const Tensor values = g.contiguous();
        std::memcpy(slot, values.data<float>(), sizeof(float) * static_cast<size_t>(p.numel()));
      }
      p.setGrad(Tensor());
    }
    std::fill(flat + unit.numel, flat + unit.padded, 0.0f);
    fillStorage(*unit.gradShard.impl()->storage, unit.shardLength);
    float* shard = unit.gradShard.data<float>();
    // A later micro-batch of an accumulating step reduces into a part of its own, added to
    // the shard below.
    Tensor part = microBatch_ > 0 ? Tensor::empty({unit.shardLength}) : Tensor();
    float* into = part.defined() ? part.data<float>() : shard;
    shard_->reduceScatter(flat, into, static_cast<size_t>(unit.shardLength), DType::F32,
                          comm::ReduceOp::Sum, options_.collective);
    buffer = Tensor();  // the whole gradients go before anything else is allocated
    // HSDP: the other groups summed the same shard over their own ranks.
    if (replicas_)
      replicas_->allreduce(into, into, static_cast<size_t>(unit.shardLength), DType::F32,
                           comm::ReduceOp::Sum, options_.collective);
    const float scale = 1.0f / static_cast<float>(world_->size());
    if (part.defined()) {
      for (int64_t j = 0; j < unit.shardLength; ++j) shard[j] += into[j] * scale;
    } else {
      for (int64_t j = 0; j < unit.shardLength; ++j) shard[j] *= scale;
    }
    unit.reduced = true;
  }

  std::shared_ptr<comm::Communicator> world_;     // the job: data, loss, broadcasts
  std::shared_ptr<comm::Communicator> shard_;     // the ranks the units are sharded over
  std::shared_ptr<comm::Communicator> replicas_;  // HSDP: this shard's replicas; else null
  FsdpOptions options_;
  OptimizerFactory optimizers_;
  LossFn loss_;
  std::shared_ptr<nn::Module> model_;
  std::vector<Unit> units_;
  std::vector<Piece> pieces_;  // the shard optimizer's parameters, in its order
  std::unique_ptr<optim::Optimizer> optimizer_;  // over this rank's pieces
  std::unique_ptr<optim::Optimizer> whole_;      // checkpoints: over the whole parameters
  bool keepGathered_ = true;
  int microBatch_ = 0;               // of the step's accumulate_ micro-batches
  bool recording_ = false;           // this forward appends to forwardOrder_
  bool orderKnown_ = false;          // forwardOrder_ holds the first step's order
  std::vector<size_t> forwardOrder_;  // units in the order forward reached them
  std::vector<int> position_;         // of each unit in forwardOrder_ (first visit; -1: none)
};

}  // namespace

std::unique_ptr<Strategy> makeFsdpStrategy(std::shared_ptr<comm::Communicator> communicator,
                                           FsdpOptions options, ModelFactory modelFactory,
                                           OptimizerFactory optimizerFactory, LossFn loss) {
  KOLO_REQUIRE(communicator != nullptr, "fsdp needs the job's communicator");
  KOLO_CHECK(modelFactory != nullptr, "fsdp: no model factory");
  KOLO_CHECK(optimizerFactory != nullptr, "fsdp: no optimizer factory");
  if (!loss) loss = crossEntropyOfModel;
  return std::make_unique<FsdpStrategy>(std::move(communicator), options, std::move(modelFactory),
                                        std::move(optimizerFactory), std::move(loss));
}

}  // namespace kolo::parallel
