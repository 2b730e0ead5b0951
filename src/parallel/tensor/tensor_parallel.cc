// Tensor-parallel layers: the two region markers (copy in / reduce out) as autograd ops,
// column- and row-parallel Linear, attention split by heads, the transformer block, and the
// model that walks a Sequential and splits what it can.
#include "kolo/parallel/tensor_parallel.h"

#include <cmath>
#include <limits>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/nn/attention.h"
#include "kolo/ops.h"

namespace kolo::parallel {

namespace {

void allreduceInPlace(Tensor& t, comm::Communicator& comm) {
  KOLO_CHECK(t.isContiguous(), "tensor parallel: all-reduce of a non-contiguous tensor");
  comm.allreduce(t.rawData(), t.rawData(), static_cast<size_t>(t.numel()), t.dtype(), comm::ReduceOp::Sum);
}

// The parameter `name` of `module` (a direct one, e.g. "weight"), or undefined.
Tensor parameterOf(const nn::Module& module, const std::string& name) {
  for (const auto& [n, t] : module.namedParameters())
    if (n == name) return t;
  return Tensor();
}

std::shared_ptr<nn::Module> childOf(const nn::Module& module, const std::string& name) {
  for (const auto& [n, m] : module.children())
    if (n == name) return m;
  KOLO_THROW(InvalidArgument, "tensor parallel: the module has no child '", name, "'");
}

// A Linear split over the ranks: column-parallel (a block of the output features, in
// `blocks` blocks) or row-parallel (a block of the input features; the bias is added once,
// after the reduction).
class ParallelLinear : public nn::Module {
 public:
  ParallelLinear(const nn::Module& full, std::shared_ptr<comm::Communicator> comm, bool column, int blocks)
      : comm_(std::move(comm)), column_(column) {
    const Tensor w = parameterOf(full, "weight"), b = parameterOf(full, "bias");
    KOLO_REQUIRE(w.defined() && w.dim() == 2, "tensor parallel: a Linear without a 2-d weight");
    const int rank = comm_->rank(), parts = comm_->size();
    weight_ = registerParameter("weight", shardTensor(w, column ? 0 : 1, column ? blocks : 1, rank, parts));
    if (b.defined()) bias_ = registerParameter("bias", column ? shardTensor(b, 0, blocks, rank, parts) : b.clone());
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    if (column_) return linear(copyToTensorParallel(x, comm_), weight_, bias_);  // (.., out/T)
    Tensor partial = linear(x, weight_, Tensor());                                // (.., out) partial sums
    Tensor y = reduceFromTensorParallel(partial, comm_);
    return bias_.defined() ? y + bias_ : y;
  }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  bool column_;
  Tensor weight_, bias_;
};

// Causal self-attention with H/T heads on each rank: qkv column-parallel (q, k and v each
// split by heads), proj row-parallel.
class ParallelAttention : public nn::Module {
 public:
  ParallelAttention(const nn::CausalSelfAttention& full, std::shared_ptr<comm::Communicator> comm)
      : heads_(full.numHeads() / comm->size()), width_(full.embedDim() / comm->size()) {
    KOLO_REQUIRE(full.numHeads() % comm->size() == 0, "tensor parallel: ", full.numHeads(),
                 " attention heads cannot be split over ", comm->size(), " ranks (--heads must be a multiple of --tp)");
    registerModule("qkv", std::make_shared<ParallelLinear>(*childOf(full, "qkv"), comm, true, 3));
    registerModule("proj", std::make_shared<ParallelLinear>(*childOf(full, "proj"), comm, false, 1));
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.shape()[0], t = x.shape()[1], c = width_, h = heads_, hd = c / h;
    Tensor qkv = children()[0].second->forward(x);  // (B, T, 3C/T)
    auto head = [&](int64_t i) { return qkv.slice(2, i * c, (i + 1) * c).reshape({b, t, h, hd}).transpose(1, 2); };
    Tensor q = head(0), k = head(1), v = head(2);  // (B, H/T, T, hd)
    Tensor att = matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = where(trilMask(t), att, Tensor::scalar(-std::numeric_limits<double>::infinity(), att.dtype()));
    att = softmax(att, -1);
    Tensor y = matmul(att, v).transpose(1, 2).reshape({b, t, c});  // (B, T, C/T)
    return children()[1].second->forward(y);
  }

 private:
  int64_t heads_, width_;
};

// x + attn(ln1(x)), then + mlp(ln2(.)); the norms are the whole model's (replicated).
class ParallelBlock : public nn::Module {
 public:
  ParallelBlock(const nn::Module& full, std::shared_ptr<comm::Communicator> comm) {
    const auto attn = std::dynamic_pointer_cast<nn::CausalSelfAttention>(childOf(full, "attn"));
    KOLO_REQUIRE(attn != nullptr, "tensor parallel: a TransformerBlock without its attention");
    ln1_ = registerModule("ln1", childOf(full, "ln1"));
    attn_ = registerModule("attn", std::make_shared<ParallelAttention>(*attn, comm));
    ln2_ = registerModule("ln2", childOf(full, "ln2"));
    const auto mlp = childOf(full, "mlp");
    auto split = std::make_shared<nn::Sequential>();
    split->add(std::make_shared<ParallelLinear>(*childOf(*mlp, "0"), comm, true, 1));
    split->add(childOf(*mlp, "1"));
    split->add(std::make_shared<ParallelLinear>(*childOf(*mlp, "2"), comm, false, 1));
    mlp_ = registerModule("mlp", split);
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    Tensor h = x + attn_->forward(ln1_->forward(x));
    return h + mlp_->forward(ln2_->forward(h));
  }

 private:
  std::shared_ptr<nn::Module> ln1_, attn_, ln2_, mlp_;
};

bool elementwise(const nn::Module& m) {
  return dynamic_cast<const nn::ReLU*>(&m) || dynamic_cast<const nn::GELU*>(&m) || dynamic_cast<const nn::Tanh*>(&m);
}

}  // namespace

Tensor copyToTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  Tensor out = x.detach();
  return autograd::record(out, {x}, "CopyToTensorParallel", [comm](const Tensor& g) {
    Tensor sum = g.clone();
    allreduceInPlace(sum, *comm);
    return std::vector<Tensor>{sum};
  });
}

Tensor reduceFromTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  Tensor out = x.contiguous().clone();
  allreduceInPlace(out, *comm);
  return autograd::record(out, {x}, "ReduceFromTensorParallel",
                          [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor shardTensor(const Tensor& full, int dim, int blocks, int rank, int parts) {
  KOLO_REQUIRE(dim >= 0 && dim < full.dim() && blocks >= 1 && parts >= 1 && rank >= 0 && rank < parts,
               "shardTensor: dim ", dim, ", blocks ", blocks, ", rank ", rank, " of ", parts, " for ",
               shapeString(full.shape()));
  const int64_t size = full.shape()[static_cast<size_t>(dim)];
  KOLO_REQUIRE(size % (static_cast<int64_t>(blocks) * parts) == 0, "tensor parallel: dimension ", dim, " of ",
               shapeString(full.shape()), " (", size, ") cannot be split in ", blocks, " block(s) over ", parts,
               " ranks");
  const int64_t block = size / blocks, chunk = block / parts;
  std::vector<Tensor> pieces;
  for (int b = 0; b < blocks; ++b)
    pieces.push_back(full.slice(dim, b * block + rank * chunk, b * block + (rank + 1) * chunk).detach());
  Tensor part = pieces.size() == 1 ? pieces[0].contiguous().clone() : cat(pieces, dim).detach().contiguous();
  return part;
}

TensorParallelModel::TensorParallelModel(const nn::Sequential& whole, std::shared_ptr<comm::Communicator> comm)
    : comm_(std::move(comm)) {
  KOLO_REQUIRE(comm_ != nullptr, "tensor parallel needs a communicator");
  const auto& layers = whole.children();
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& [name, layer] = layers[i];
    if (dynamic_cast<const nn::TransformerBlock*>(layer.get())) {
      auto block = std::make_shared<ParallelBlock>(*layer, comm_);
      registerModule(name, block);
      specs_[name + ".attn.qkv.weight"] = {0, 3};
      specs_[name + ".attn.qkv.bias"] = {0, 3};
      specs_[name + ".attn.proj.weight"] = {1, 1};
      specs_[name + ".mlp.0.weight"] = {0, 1};
      specs_[name + ".mlp.0.bias"] = {0, 1};
      specs_[name + ".mlp.2.weight"] = {1, 1};
      continue;
    }
    if (dynamic_cast<const nn::Linear*>(layer.get())) {
      // Pair with the next Linear when only element-wise layers lie between.
      size_t j = i + 1;
      while (j < layers.size() && elementwise(*layers[j].second)) ++j;
      if (j < layers.size() && dynamic_cast<const nn::Linear*>(layers[j].second.get())) {
        auto column = std::make_shared<ParallelLinear>(*layer, comm_, true, 1);
        registerModule(name, column);
        specs_[name + ".weight"] = {0, 1};
        specs_[name + ".bias"] = {0, 1};
        for (size_t k = i + 1; k < j; ++k) registerModule(layers[k].first, layers[k].second);
        auto row = std::make_shared<ParallelLinear>(*layers[j].second, comm_, false, 1);
        registerModule(layers[j].first, row);
        specs_[layers[j].first + ".weight"] = {1, 1};  // its bias is replicated
        i = j;
        continue;
      }
    }
    registerModule(name, layer);  // replicated
  }
}

Tensor TensorParallelModel::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& child : children()) h = child.second->forward(h);
  return h;
}

void TensorParallelModel::gatherInto(nn::Module* whole, int root) {
  const int parts = comm_->size(), rank = comm_->rank();
  std::map<std::string, Tensor> target;
  if (rank == root) {
    KOLO_REQUIRE(whole != nullptr, "tensor parallel: gatherInto needs the whole model on rank ", root);
    for (const auto& [name, t] : whole->namedParameters()) target[name] = t;
  }
  for (const auto& [name, local] : namedParameters()) {
    const auto spec = specs_.find(name);
    if (spec == specs_.end() || spec->second.dim < 0) {
      if (rank == root) target.at(name).copyFrom(local);
      continue;
    }
    // Every rank's shard, then each rank's block slices back into place.
    const Tensor mine = local.contiguous();
    Tensor all = Tensor::empty({parts * mine.numel()}, mine.dtype());
    comm_->allgather(mine.rawData(), all.rawData(), static_cast<size_t>(mine.numel()), mine.dtype());
    if (rank != root) continue;
    Tensor full = target.at(name);
    const int dim = spec->second.dim, blocks = spec->second.blocks;
    const int64_t block = full.shape()[static_cast<size_t>(dim)] / blocks, chunk = block / parts;
    for (int r = 0; r < parts; ++r) {
      const Tensor shard = all.slice(0, r * mine.numel(), (r + 1) * mine.numel()).reshape(mine.shape());
      for (int b = 0; b < blocks; ++b)
        full.slice(dim, b * block + r * chunk, b * block + (r + 1) * chunk)
            .copyFrom(shard.slice(dim, b * chunk, (b + 1) * chunk));
    }
  }
}

}  // namespace kolo::parallel
