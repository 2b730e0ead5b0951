// The plan's styles applied in place: column- and row-wise Linear-like modules, the
// vocabulary-parallel embedding and head, sequence-parallel norms and attention by heads.
// A parameter becomes this rank's shard by taking the shard's storage into its own
// TensorImpl, so that every handle to it (the module's member, the parameter list) sees it;
// the collectives are the module's input and output transforms (regions.cc's autograd ops).
#include "parallel/tensor/styles.h"

#include "kolo/error.h"
#include "kolo/nn/attention.h"
#include "kolo/nn/llama.h"
#include "kolo/ops.h"

namespace kolo::parallel::detail {

namespace {

// The direct parameter `name` of `module` ("weight"), or undefined.
Tensor parameterOf(const nn::Module& module, const std::string& name) {
  for (const auto& [n, t] : module.namedParameters())
    if (n == name) return t;
  return Tensor();
}

std::shared_ptr<nn::Module> childOf(const nn::Module& module, const std::string& name) {
  for (const auto& [n, m] : module.children())
    if (n == name) return m;
  return nullptr;
}

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

// The 2-d weight a Linear-like or embedding style splits; throws naming the path otherwise.
Tensor weightOf(const std::string& path, const nn::Module& module, const ParallelStyle& style) {
  const Tensor w = parameterOf(module, "weight");
  KOLO_REQUIRE(w.defined() && w.dim() == 2, "tensor-parallel plan: module '", path, "' (",
               styleName(style), ") has no 2-d parameter \"weight\"",
               w.defined() ? " (it is " + shapeString(w.shape()) + ")" : std::string());
  return w;
}

void requireDivides(const std::string& path, const ParallelStyle& style, const std::string& what,
                    const Tensor& t, int64_t size, int64_t parts) {
  const int64_t unit = style.unit > 0 ? style.unit : 1;
  KOLO_REQUIRE(size % unit == 0 && (size / unit) % parts == 0, "tensor-parallel plan: module '", path,
               "' (", styleName(style), "): ", what, " ", size, " of its weight ", shapeString(t.shape()),
               unit > 1 ? " (heads of " + std::to_string(unit) + ")" : std::string(),
               " cannot be split over ", parts, " ranks");
}

// q, k, v column-wise on head boundaries and o row-wise (nn::GroupedQueryAttention).
void requireGroupedHeads(const std::string& path, const nn::GroupedQueryAttention& attention, int parts) {
  KOLO_REQUIRE(attention.heads() % parts == 0 && attention.kvHeads() % parts == 0,
               "tensor-parallel plan: module '", path, "': ", attention.heads(), " query and ",
               attention.kvHeads(), " key/value attention heads cannot be split over ", parts,
               " ranks (it must divide both)");
}

// Counts the forwards that reach `module` through operator(), where its transforms run.
void countCalls(const std::string& path, nn::Module& module, SplitContext& context) {
  auto calls = std::make_shared<int64_t>(0);
  module.addForwardPreHook([calls](nn::Module&) { ++*calls; });
  context.reached.emplace_back(path, calls);
}

// Makes `param` (every handle to it) hold `shard`; a tensor split before (tied weights) must
// have been split alike.
void becomeShard(Tensor param, int dim, int blocks, const std::string& name, SplitContext& context) {
  const ShardSpec spec{dim, blocks};
  context.specs[name] = spec;
  const auto done = context.splitTensors.find(param.impl());
  if (done != context.splitTensors.end()) {
    KOLO_REQUIRE(done->second.dim == dim && done->second.blocks == blocks, "tensor-parallel plan: '",
                 name, "' is shared with a parameter split another way");
    return;
  }
  const Tensor shard = shardTensor(param, dim, blocks, context.comm->rank(), context.comm->size());
  TensorImpl* impl = param.impl();
  impl->storage = shard.impl()->storage;
  impl->shape = shard.shape();
  impl->strides = shard.strides();
  impl->offset = shard.storageOffset();
  impl->autograd.reset();  // the whole tensor's gradient, if any, no longer fits
  param.setRequiresGrad(true);
  context.splitTensors[impl] = spec;
}

void splitColumns(const std::string& path, nn::Module& module, int blocks, bool gatherOutput,
                  SplitContext& context) {
  becomeShard(parameterOf(module, "weight"), 0, blocks, join(path, "weight"), context);
  if (const Tensor bias = parameterOf(module, "bias"); bias.defined())
    becomeShard(bias, 0, blocks, join(path, "bias"), context);
  countCalls(path, module, context);
  auto comm = context.comm;
  const bool sequenceParallel = context.sequenceParallel;
  module.addInputTransform([comm, sequenceParallel](nn::Module&, const Tensor& x) {
    return sequenceParallel ? gatherSequence(x, comm) : copyToTensorParallel(x, comm);
  });
  if (gatherOutput)
    module.addOutputTransform(
        [comm](nn::Module&, const Tensor& y) { return gatherFeatures(y, comm); });
}

void splitRows(const std::string& path, nn::Module& module, SplitContext& context) {
  becomeShard(parameterOf(module, "weight"), 1, 1, join(path, "weight"), context);
  countCalls(path, module, context);
  auto comm = context.comm;
  const bool sequenceParallel = context.sequenceParallel;
  // The module adds its (replicated) bias on every rank; it must count once in the sum, so
  // the partial outputs are summed without it and it is added after. Its gradient is whole
  // on every rank: the sum's backward hands each rank the whole output gradient.
  const Tensor bias = parameterOf(module, "bias");
  module.addOutputTransform([comm, sequenceParallel, bias](nn::Module&, const Tensor& y) {
    const Tensor b = bias.defined() ? bias.detach() : Tensor();
    const Tensor partial = b.defined() ? y - b : y;
    const Tensor sum =
        sequenceParallel ? scatterSequence(partial, comm) : reduceFromTensorParallel(partial, comm);
    return b.defined() ? sum + b : sum;
  });
}

// Ids outside this rank's rows look up row 0 and their rows are zeroed; the ranks' rows are
// then summed (by `reduce`, given the table's masked output).
void splitTable(const std::string& path, nn::Module& table, SplitContext& context) {
  const Tensor weight = parameterOf(table, "weight");
  const int64_t rows = weight.shape()[0] / context.comm->size();
  const int64_t first = context.comm->rank() * rows;
  becomeShard(weight, 0, 1, join(path, "weight"), context);
  countCalls(path, table, context);
  auto mask = std::make_shared<Tensor>();
  table.addInputTransform([mask, first, rows](nn::Module&, const Tensor& ids) {
    const std::vector<double> all = ids.toDoubleVector();
    std::vector<int64_t> local(all.size());
    std::vector<float> mine(all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      const int64_t id = static_cast<int64_t>(all[i]) - first;
      const bool here = id >= 0 && id < rows;
      local[i] = here ? id : 0;
      mine[i] = here ? 1.0f : 0.0f;
    }
    Shape withRow = ids.shape();
    withRow.push_back(1);
    *mask = Tensor::fromVector(withRow, mine);  // (..., 1)
    return Tensor::fromVector(ids.shape(), local);
  });
  table.addOutputTransform([mask](nn::Module&, const Tensor& rowsOut) {
    return rowsOut * *mask;  // (..., C), zero rows for the other ranks' ids
  });
}

void splitEmbedding(const std::string& path, nn::Module& module, SplitContext& context) {
  auto comm = context.comm;
  const bool sequenceParallel = context.sequenceParallel;
  if (parameterOf(module, "weight").defined()) {
    splitTable(path, module, context);
    // The masked rows then summed: all-reduced, or reduce-scattered to each rank's tokens.
    module.addOutputTransform([comm, sequenceParallel](nn::Module&, const Tensor& partial) {
      return sequenceParallel ? scatterSequence(partial, comm)
                              : reduceFromTensorParallel(partial, comm);
    });
    return;
  }
  // A table inside (nn::TokenPositionEmbedding's "tok"): its rows summed there, before what
  // the module adds (positions); under sequence parallelism the module's output is split.
  const auto table = childOf(module, "tok");
  splitTable(join(path, "tok"), *table, context);
  table->addOutputTransform([comm](nn::Module&, const Tensor& partial) {
    return reduceFromTensorParallel(partial, comm);
  });
  if (sequenceParallel)
    module.addOutputTransform(
        [comm](nn::Module&, const Tensor& y) { return splitSequence(y, comm); });
}

}  // namespace

bool pathMatches(const std::string& pattern, const std::string& path) {
  // Greedy glob with backtracking to the last '*'.
  size_t p = 0, s = 0, star = std::string::npos, resume = 0;
  while (s < path.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = s;
    } else if (p < pattern.size() && pattern[p] == path[s]) {
      ++p;
      ++s;
    } else if (star != std::string::npos) {
      p = star + 1;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool coversChildren(const nn::Module& module, const ParallelStyle& style) {
  using Kind = ParallelStyle::Kind;
  return style.kind == Kind::AttentionHeads ||
         (style.kind == Kind::VocabularyEmbedding && !parameterOf(module, "weight").defined());
}

void checkStyle(const std::string& path, nn::Module& module, const ParallelStyle& style, int parts) {
  using Kind = ParallelStyle::Kind;
  switch (style.kind) {
    case Kind::ColumnWise:
    case Kind::VocabularyHead: {
      const Tensor w = weightOf(path, module, style);
      KOLO_REQUIRE(style.blocks >= 1 && !(style.gatherOutput && style.blocks > 1),
                   "tensor-parallel plan: module '", path, "' (", styleName(style), "): ",
                   style.blocks, " blocks", style.gatherOutput ? " with a gathered output" : "",
                   " (blocks must be at least 1, and 1 when the output is gathered)");
      requireDivides(path, style, style.blocks > 1 ? "each of the " + std::to_string(style.blocks) +
                                                         " blocks of output features of"
                                                   : "output features",
                     w, w.shape()[0] / style.blocks, parts);
      KOLO_REQUIRE(w.shape()[0] % style.blocks == 0, "tensor-parallel plan: module '", path,
                   "': ", w.shape()[0], " output features are not ", style.blocks, " equal blocks");
      if (const Tensor b = parameterOf(module, "bias"); b.defined())
        KOLO_REQUIRE(b.dim() == 1 && b.shape()[0] == w.shape()[0], "tensor-parallel plan: module '",
                     path, "': bias ", shapeString(b.shape()), " does not match weight ",
                     shapeString(w.shape()));
      return;
    }
    case Kind::RowWise: {
      const Tensor w = weightOf(path, module, style);
      requireDivides(path, style, "input features", w, w.shape()[1], parts);
      return;
    }
    case Kind::VocabularyEmbedding: {
      nn::Module* table = &module;
      std::string at = path;
      if (!parameterOf(module, "weight").defined()) {
        const auto tok = childOf(module, "tok");
        KOLO_REQUIRE(tok != nullptr, "tensor-parallel plan: module '", path,
                     "' (vocabulary-parallel embedding) has neither a 2-d parameter \"weight\" nor a "
                     "child \"tok\" that holds one");
        table = tok.get();
        at = join(path, "tok");
      }
      const Tensor w = weightOf(at, *table, style);
      KOLO_REQUIRE(w.shape()[0] % parts == 0, "tensor-parallel plan: module '", at,
                   "' (vocabulary-parallel embedding): a vocabulary of ", w.shape()[0],
                   " tokens cannot be split over ", parts, " ranks (weight ", shapeString(w.shape()), ")");
      return;
    }
    case Kind::AttentionHeads: {
      if (const auto* grouped = dynamic_cast<const nn::GroupedQueryAttention*>(&module)) {
        requireGroupedHeads(path, *grouped, parts);
        return;
      }
      const auto* attention = dynamic_cast<const nn::CausalSelfAttention*>(&module);
      KOLO_REQUIRE(attention != nullptr, "tensor-parallel plan: module '", path,
                   "' is neither an nn::CausalSelfAttention nor an nn::GroupedQueryAttention; "
                   "attention by heads splits kolo's own attention (a module of the user's with "
                   "separate q, k, v and output Linears takes columnWiseHeads for q, k, v and "
                   "rowWiseHeads for the output)");
      KOLO_REQUIRE(attention->numHeads() % parts == 0, "tensor-parallel plan: module '", path, "': ",
                   attention->numHeads(), " attention heads cannot be split over ", parts, " ranks");
      const Tensor qkv = weightOf(join(path, "qkv"), *childOf(module, "qkv"), columnWise());
      KOLO_REQUIRE(qkv.shape()[0] == 3 * attention->embedDim(), "tensor-parallel plan: module '",
                   path, "': qkv ", shapeString(qkv.shape()), " is not three blocks of ",
                   attention->embedDim(), " features");
      return;
    }
    case Kind::SequenceNorm:
    case Kind::Replicated:
      return;
  }
}

std::vector<PlannedSplit> plannedSplits(const std::string& path, nn::Module& module, const ParallelStyle& style) {
  using Kind = ParallelStyle::Kind;
  std::vector<PlannedSplit> splits;
  // The weight (and a column-wise layer's bias) of the Linear-like or table module at `at`.
  auto add = [&](const std::string& at, nn::Module& m, ShardSpec spec, bool withBias) {
    splits.push_back({join(at, "weight"), parameterOf(m, "weight"), spec});
    if (const Tensor bias = parameterOf(m, "bias"); withBias && bias.defined())
      splits.push_back({join(at, "bias"), bias, spec});
  };
  switch (style.kind) {
    case Kind::ColumnWise:
      add(path, module, {0, style.blocks}, true);
      break;
    case Kind::VocabularyHead:
      add(path, module, {0, 1}, true);
      break;
    case Kind::RowWise:
      add(path, module, {1, 1}, false);
      break;
    case Kind::VocabularyEmbedding:
      if (parameterOf(module, "weight").defined())
        add(path, module, {0, 1}, false);
      else
        add(join(path, "tok"), *childOf(module, "tok"), {0, 1}, false);
      break;
    case Kind::AttentionHeads:
      if (dynamic_cast<const nn::GroupedQueryAttention*>(&module)) {
        for (const char* name : {"q", "k", "v"}) add(join(path, name), *childOf(module, name), {0, 1}, true);
        add(join(path, "o"), *childOf(module, "o"), {1, 1}, false);
      } else {
        add(join(path, "qkv"), *childOf(module, "qkv"), {0, 3}, true);
        add(join(path, "proj"), *childOf(module, "proj"), {1, 1}, false);
      }
      break;
    case Kind::SequenceNorm:
    case Kind::Replicated:
      break;
  }
  return splits;
}

void applyStyle(const std::string& path, nn::Module& module, const ParallelStyle& style,
                SplitContext& context) {
  using Kind = ParallelStyle::Kind;
  switch (style.kind) {
    case Kind::ColumnWise:
      splitColumns(path, module, style.blocks, style.gatherOutput, context);
      return;
    case Kind::VocabularyHead:
      splitColumns(path, module, 1, false, context);
      context.vocabularyOutput = true;
      return;
    case Kind::RowWise:
      splitRows(path, module, context);
      return;
    case Kind::VocabularyEmbedding:
      splitEmbedding(path, module, context);
      return;
    case Kind::AttentionHeads:
      // The module computes as many heads as its projections' widths hold.
      if (dynamic_cast<const nn::GroupedQueryAttention*>(&module)) {
        for (const char* name : {"q", "k", "v"})
          splitColumns(join(path, name), *childOf(module, name), 1, false, context);
        splitRows(join(path, "o"), *childOf(module, "o"), context);
        return;
      }
      splitColumns(join(path, "qkv"), *childOf(module, "qkv"), 3, false, context);
      splitRows(join(path, "proj"), *childOf(module, "proj"), context);
      return;
    case Kind::SequenceNorm:
      if (context.sequenceParallel)
        for (const auto& [name, t] : module.namedParameters()) context.sequenceParameters.push_back(t);
      return;
    case Kind::Replicated:
      return;
  }
}

}  // namespace kolo::parallel::detail
