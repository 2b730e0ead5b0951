// Tensor-parallel layers: column- and row-parallel Linear, attention split by heads, the
// transformer block, the embedding and output head split by vocabulary, the LayerNorm of a
// sequence-parallel region, and the model that walks a Sequential and splits what it can.
// The region markers (all-reduce, all-gather, reduce-scatter as autograd ops) are in
// regions.cc.
#include "kolo/parallel/tensor_parallel.h"


#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/nn/attention.h"
#include "kolo/nn/language_model.h"
#include "kolo/ops.h"

namespace kolo::parallel {

namespace {
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
// after the reduction). Under sequence parallelism the column-parallel input is the ranks'
// tokens gathered, and the row-parallel output is reduce-scattered back to them (the bias,
// then added to part of the tokens on each rank, has its gradient all-reduced).
class ParallelLinear : public nn::Module {
 public:
  ParallelLinear(const nn::Module& full, std::shared_ptr<comm::Communicator> comm, bool column,
                 int blocks, bool sequenceParallel = false)
      : comm_(std::move(comm)), column_(column), sequenceParallel_(sequenceParallel) {
    const Tensor w = parameterOf(full, "weight"), b = parameterOf(full, "bias");
    KOLO_REQUIRE(w.defined() && w.dim() == 2, "tensor parallel: a Linear without a 2-d weight");
    const int rank = comm_->rank(), parts = comm_->size();
    weight_ = registerParameter("weight", shardTensor(w, column ? 0 : 1, column ? blocks : 1, rank, parts));
    if (b.defined()) bias_ = registerParameter("bias", column ? shardTensor(b, 0, blocks, rank, parts) : b.clone());
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    if (column_) {
      const Tensor in =
          sequenceParallel_ ? gatherSequence(x, comm_) : copyToTensorParallel(x, comm_);
      return linear(in, weight_, bias_);  // (.., out/T)
    }
    Tensor partial = linear(x, weight_, Tensor());  // (.., out) partial sums
    if (!sequenceParallel_) {
      Tensor y = reduceFromTensorParallel(partial, comm_);
      return bias_.defined() ? y + bias_ : y;
    }
    Tensor y = scatterSequence(partial, comm_);  // (B, S/T, out)
    return bias_.defined() ? y + copyToTensorParallel(bias_, comm_) : y;
  }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  bool column_, sequenceParallel_;
  Tensor weight_, bias_;
};

// Causal self-attention with H/T heads on each rank: qkv column-parallel (q, k and v each
// split by heads), proj row-parallel.
class ParallelAttention : public nn::Module {
 public:
  ParallelAttention(const nn::CausalSelfAttention& full, std::shared_ptr<comm::Communicator> comm,
                    bool sequenceParallel)
      : heads_(full.numHeads() / comm->size()) {
    KOLO_REQUIRE(full.numHeads() % comm->size() == 0, "tensor parallel: ", full.numHeads(),
                 " attention heads cannot be split over ", comm->size(), " ranks (--heads must be a multiple of --tp)");
    registerModule("qkv", std::make_shared<ParallelLinear>(*childOf(full, "qkv"), comm, true, 3,
                                                           sequenceParallel));
    registerModule("proj", std::make_shared<ParallelLinear>(*childOf(full, "proj"), comm, false, 1,
                                                            sequenceParallel));
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    // (B, T, 3C/T): every token, also under sequence parallelism; q, k and v of this rank's
    // heads side by side, the layout the fused causal attention takes (no T x T matrix kept).
    // The children through operator(), so that their hooks fire, as in nn::CausalSelfAttention.
    const Tensor qkv = (*children()[0].second)(x);
    return (*children()[1].second)(causalAttention(qkv, heads_));  // proj of (B, T, C/T)
  }

 private:
  int64_t heads_;
};

// A LayerNorm inside a sequence-parallel region: each rank normalises its own tokens, so its
// weight and bias gradients are partial sums, all-reduced backward. Shares the whole model's
// parameters.
class SequenceParallelLayerNorm : public nn::Module {
 public:
  SequenceParallelLayerNorm(const nn::LayerNorm& full, std::shared_ptr<comm::Communicator> comm)
      : comm_(std::move(comm)), shape_(full.normalizedShape()), eps_(full.eps()) {
    weight_ = registerParameter("weight", full.weight);
    bias_ = registerParameter("bias", full.bias);
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    return layerNorm(x, shape_, copyToTensorParallel(weight_, comm_),
                     copyToTensorParallel(bias_, comm_), eps_);
  }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  Shape shape_;
  double eps_;
  Tensor weight_, bias_;
};

std::shared_ptr<nn::Module> normFor(const std::shared_ptr<nn::Module>& norm,
                                    std::shared_ptr<comm::Communicator> comm,
                                    bool sequenceParallel) {
  if (!sequenceParallel) return norm;  // replicated
  const auto layerNorm = std::dynamic_pointer_cast<nn::LayerNorm>(norm);
  KOLO_REQUIRE(layerNorm != nullptr, "sequence parallel: a norm that is not a LayerNorm");
  return std::make_shared<SequenceParallelLayerNorm>(*layerNorm, std::move(comm));
}

// x + attn(ln1(x)), then + mlp(ln2(.)); the norms are the whole model's (replicated), or
// sequence-parallel ones, when x holds this rank's tokens only.
class ParallelBlock : public nn::Module {
 public:
  ParallelBlock(const nn::Module& full, std::shared_ptr<comm::Communicator> comm,
                bool sequenceParallel) {
    const auto attn = std::dynamic_pointer_cast<nn::CausalSelfAttention>(childOf(full, "attn"));
    KOLO_REQUIRE(attn != nullptr, "tensor parallel: a TransformerBlock without its attention");
    ln1_ = registerModule("ln1", normFor(childOf(full, "ln1"), comm, sequenceParallel));
    attn_ =
        registerModule("attn", std::make_shared<ParallelAttention>(*attn, comm, sequenceParallel));
    ln2_ = registerModule("ln2", normFor(childOf(full, "ln2"), comm, sequenceParallel));
    const auto mlp = childOf(full, "mlp");
    auto split = std::make_shared<nn::Sequential>();
    split->add(
        std::make_shared<ParallelLinear>(*childOf(*mlp, "0"), comm, true, 1, sequenceParallel));
    split->add(childOf(*mlp, "1"));
    split->add(
        std::make_shared<ParallelLinear>(*childOf(*mlp, "2"), comm, false, 1, sequenceParallel));
    mlp_ = registerModule("mlp", split);
  }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    // The children through operator(), as nn::TransformerBlock calls them.
    Tensor h = x + (*attn_)((*ln1_)(x));
    return h + (*mlp_)((*ln2_)(h));
  }

 private:
  std::shared_ptr<nn::Module> ln1_, attn_, ln2_, mlp_;
};

// Rows of an embedding table (parameter "weight"), looked up by ids local to them.
class EmbeddingShard : public nn::Module {
 public:
  explicit EmbeddingShard(const Tensor& rows) { weight = registerParameter("weight", rows); }
  using Module::forward;
  Tensor forward(const Tensor& localIds) override { return embedding(localIds, weight); }
  Tensor weight;
};

// Token + position embedding with the token table split by vocabulary: rank r holds rows
// r·V/T ... (r+1)·V/T − 1, looks up the ids in its range and zeroes the others, and the ranks'
// rows are summed (all-reduced, or reduce-scattered to each rank's tokens under sequence
// parallelism). The position table is replicated; under sequence parallelism each rank adds
// its tokens' rows and the table's gradient is all-reduced.
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(const nn::TokenPositionEmbedding& full,
                         std::shared_ptr<comm::Communicator> comm, bool sequenceParallel)
      : comm_(std::move(comm)), sequenceParallel_(sequenceParallel) {
    const Tensor table = full.tokens()->weight;  // [V, C]
    KOLO_REQUIRE(table.shape()[0] % comm_->size() == 0, "tensor parallel: a vocabulary of ",
                 table.shape()[0], " tokens cannot be split over ", comm_->size(), " ranks");
    tok_ = registerModule("tok", std::make_shared<EmbeddingShard>(
                                     shardTensor(table, 0, 1, comm_->rank(), comm_->size())));
    pos_ = registerModule("pos", full.positions());
  }
  using Module::forward;
  Tensor forward(const Tensor& ids) override {
    KOLO_REQUIRE(ids.dim() == 2, "VocabParallelEmbedding: input ", shapeString(ids.shape()),
                 " is not (B, T) token ids");
    const int64_t b = ids.shape()[0], t = ids.shape()[1], rows = tok_->weight.shape()[0];
    const int64_t first = comm_->rank() * rows;
    KOLO_REQUIRE(t <= pos_->weight.shape()[0], "VocabParallelEmbedding: sequence of ", t,
                 " tokens is longer than the position table (", pos_->weight.shape()[0], ")");
    // Ids outside this rank's rows look up row 0 and are zeroed by the mask.
    const std::vector<double> all = ids.toDoubleVector();
    std::vector<int64_t> local(all.size());
    std::vector<float> mine(all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      const int64_t id = static_cast<int64_t>(all[i]) - first;
      const bool here = id >= 0 && id < rows;
      local[i] = here ? id : 0;
      mine[i] = here ? 1.0f : 0.0f;
    }
    const Tensor partial = tok_->forward(Tensor::fromVector({b, t}, local)) *
                           Tensor::fromVector({b, t, 1}, mine);  // (B, T, C), zero rows elsewhere
    if (!sequenceParallel_)
      return reduceFromTensorParallel(partial, comm_) + pos_->forward(positions(0, t));
    const Tensor tokens = scatterSequence(partial, comm_);  // (B, T/P, C)
    const int64_t part = tokens.shape()[1];
    return tokens + embedding(positions(comm_->rank() * part, part),
                              copyToTensorParallel(pos_->weight, comm_));
  }

 private:
  static Tensor positions(int64_t first, int64_t count) {
    std::vector<int64_t> at(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) at[static_cast<size_t>(i)] = first + i;
    return Tensor::fromVector({count}, at);
  }
  std::shared_ptr<comm::Communicator> comm_;
  bool sequenceParallel_;
  std::shared_ptr<EmbeddingShard> tok_;
  std::shared_ptr<nn::Embedding> pos_;
};

bool elementwise(const nn::Module& m) {
  return dynamic_cast<const nn::ReLU*>(&m) || dynamic_cast<const nn::GELU*>(&m) || dynamic_cast<const nn::Tanh*>(&m);
}

}  // namespace

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

Tensor unshardTensor(const std::vector<Tensor>& parts, int dim, int blocks) {
  KOLO_REQUIRE(!parts.empty() && blocks >= 1 && dim >= 0 && dim < parts[0].dim() &&
                   parts[0].shape()[static_cast<size_t>(dim)] % blocks == 0,
               "unshardTensor: ", parts.size(), " parts, dim ", dim, ", blocks ", blocks);
  if (parts.size() == 1) return parts[0].contiguous().clone();
  const int64_t chunk = parts[0].shape()[static_cast<size_t>(dim)] / blocks;
  std::vector<Tensor> pieces;
  for (int b = 0; b < blocks; ++b)
    for (const Tensor& part : parts) {
      KOLO_REQUIRE(part.shape() == parts[0].shape(), "unshardTensor: parts ",
                   shapeString(parts[0].shape()), " and ", shapeString(part.shape()), " differ");
      pieces.push_back(part.detach().slice(dim, b * chunk, (b + 1) * chunk));
    }
  return cat(pieces, dim).detach().contiguous();
}

TensorParallelModel::TensorParallelModel(const nn::Sequential& whole,
                                         std::shared_ptr<comm::Communicator> comm,
                                         TensorParallelOptions options)
    : comm_(std::move(comm)) {
  KOLO_REQUIRE(comm_ != nullptr, "tensor parallel needs a communicator");
  const bool sp = options.sequenceParallel;
  const auto& layers = whole.children();
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& [name, layer] = layers[i];
    if (const auto* embed = dynamic_cast<const nn::TokenPositionEmbedding*>(layer.get())) {
      add(std::make_shared<VocabParallelEmbedding>(*embed, comm_, sp));
      specs_[name + ".tok.weight"] = {0, 1};
      continue;
    }
    if (dynamic_cast<const nn::TransformerBlock*>(layer.get())) {
      add(std::make_shared<ParallelBlock>(*layer, comm_, sp));
      specs_[name + ".attn.qkv.weight"] = {0, 3};
      specs_[name + ".attn.qkv.bias"] = {0, 3};
      specs_[name + ".attn.proj.weight"] = {1, 1};
      specs_[name + ".mlp.0.weight"] = {0, 1};
      specs_[name + ".mlp.0.bias"] = {0, 1};
      specs_[name + ".mlp.2.weight"] = {1, 1};
      continue;
    }
    if (dynamic_cast<const nn::LanguageModelHead*>(layer.get())) {
      // Column-parallel by vocabulary; the logits stay split and loss() takes them so.
      KOLO_REQUIRE(i + 1 == layers.size(),
                   "tensor parallel: the output head must be the model's last layer");
      add(std::make_shared<ParallelLinear>(*layer, comm_, true, 1, sp));
      specs_[name + ".weight"] = {0, 1};
      vocabularyOutput_ = true;
      continue;
    }
    if (sp) {
      // Between the embedding and the head every layer sees this rank's tokens only.
      const auto* placeholder = dynamic_cast<const nn::Sequential*>(layer.get());
      KOLO_REQUIRE(dynamic_cast<const nn::LayerNorm*>(layer.get()) ||
                       (placeholder && placeholder->size() == 0),
                   "--sequence-parallel works with the lm only: layer ", name,
                   " cannot take part of the tokens");
      add(normFor(layer, comm_, true));
      continue;
    }
    if (dynamic_cast<const nn::Linear*>(layer.get())) {
      // Pair with the next Linear when only element-wise layers lie between.
      size_t j = i + 1;
      while (j < layers.size() && elementwise(*layers[j].second)) ++j;
      if (j < layers.size() && dynamic_cast<const nn::Linear*>(layers[j].second.get())) {
        add(std::make_shared<ParallelLinear>(*layer, comm_, true, 1));
        specs_[name + ".weight"] = {0, 1};
        specs_[name + ".bias"] = {0, 1};
        for (size_t k = i + 1; k < j; ++k) add(layers[k].second);
        add(std::make_shared<ParallelLinear>(*layers[j].second, comm_, false, 1));
        specs_[layers[j].first + ".weight"] = {1, 1};  // its bias is replicated
        i = j;
        continue;
      }
    }
    add(layer);  // replicated
  }
}

Tensor TensorParallelModel::loss(const Tensor& output, const Tensor& targets) {
  if (vocabularyOutput_) return vocabParallelCrossEntropy(output, targets, comm_);
  const int64_t classes = output.shape().back();
  return crossEntropy(output.reshape({-1, classes}), targets.reshape({-1}));
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
    // Every rank's shard, reassembled on the root.
    const Tensor mine = local.contiguous();
    Tensor all = Tensor::empty({parts * mine.numel()}, mine.dtype());
    comm_->allgather(mine.rawData(), all.rawData(), static_cast<size_t>(mine.numel()), mine.dtype());
    if (rank != root) continue;
    std::vector<Tensor> shards;
    for (int r = 0; r < parts; ++r)
      shards.push_back(
          all.slice(0, r * mine.numel(), (r + 1) * mine.numel()).reshape(mine.shape()));
    target.at(name).copyFrom(unshardTensor(shards, spec->second.dim, spec->second.blocks));
  }
}

}  // namespace kolo::parallel
