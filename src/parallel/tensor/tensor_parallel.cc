// TensorParallelModel: a plan checked against a module tree (every pattern matches, every
// split divides, something is split) and then applied in place (styles.cc); the loss of
// split logits, the sequence-parallel norms' gradient sums, the whole model gathered back;
// and the shard arithmetic every layout shares (shardTensor / unshardTensor).
#include "kolo/parallel/tensor_parallel.h"

#include <exception>
#include <functional>
#include <set>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/ops.h"
#include "parallel/tensor/styles.h"

namespace kolo::parallel {

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

namespace {

// A fingerprint of a plan's entries (patterns, styles) and sequence parallelism, exact in a
// double: stages that hold equal plans print equal numbers.
double planPrint(const TensorParallelPlan& plan) {
  std::string text = plan.sequenceParallel ? "sp" : "";
  for (const auto& [pattern, style] : plan.styles)
    text += pattern + '\n' + styleName(style) + '\n';
  return static_cast<double>(std::hash<std::string>{}(text) & ((uint64_t{1} << 52) - 1));
}

}  // namespace

TensorParallelModel::TensorParallelModel(std::shared_ptr<nn::Module> model,
                                         std::shared_ptr<comm::Communicator> comm,
                                         TensorParallelPlan plan, comm::Communicator* stages)
    : model_(std::move(model)), comm_(std::move(comm)), plan_(std::move(plan)) {
  KOLO_REQUIRE(model_ != nullptr, "TensorParallelModel: the model is null");
  KOLO_REQUIRE(comm_ != nullptr, "TensorParallelModel: tensor parallelism needs a communicator");
  // Which entry each module takes: the first that matches, none inside a module whose style
  // splits its children itself.
  std::vector<Match> matches;
  std::vector<double> counts(plan_.styles.size() + 2, 0.0);  // per entry, then splits, problems
  std::string covered;  // the path prefix of the last module that covers its children
  for (const auto& [path, module] : model_->namedModules()) {
    if (path.empty()) continue;  // the root: a plan names the modules inside it
    if (!covered.empty() && path.rfind(covered, 0) == 0) continue;
    covered.clear();
    for (size_t e = 0; e < plan_.styles.size(); ++e) {
      if (!detail::pathMatches(plan_.styles[e].first, path)) continue;
      matches.push_back({path, module, e});
      counts[e] += 1;
      if (detail::coversChildren(*module, plan_.styles[e].second)) covered = path + ".";
      break;
    }
  }
  // Each style's needs, checked on this rank's part before anything is split; with stages,
  // every stage learns whether another one failed, so that none is left waiting.
  std::exception_ptr problem;
  try {
    for (const Match& m : matches)
      detail::checkStyle(m.path, *m.module, plan_.styles[m.entry].second, comm_->size());
    checkSharedTensors(matches);
  } catch (const InvalidArgument&) {
    problem = std::current_exception();
  }
  for (const Match& m : matches) {
    using Kind = ParallelStyle::Kind;
    const Kind kind = plan_.styles[m.entry].second.kind;
    if (kind != Kind::Replicated && kind != Kind::SequenceNorm) counts[counts.size() - 2] += 1;
  }
  counts.back() = problem ? 1.0 : 0.0;
  // The stages hold the same plan (one of the user's), or each its own (the default plan of a
  // part built alone): the per-entry counts are summed over the stages only in the first case,
  // so every stage first learns which it is, and the collectives' sizes agree.
  bool samePlan = true;
  if (stages && stages->size() > 1) {
    const double print = planPrint(plan_);
    double extremes[2] = {print, -print};
    stages->allreduce(extremes, extremes, 2, DType::F64, comm::ReduceOp::Max);
    samePlan = extremes[0] == -extremes[1];
    if (samePlan)
      stages->allreduce(counts.data(), counts.data(), counts.size(), DType::F64, comm::ReduceOp::Sum);
    else
      stages->allreduce(counts.data() + counts.size() - 2, counts.data() + counts.size() - 2, 2, DType::F64,
                        comm::ReduceOp::Sum);
  }
  if (problem) std::rethrow_exception(problem);
  KOLO_REQUIRE(counts.back() == 0.0, "TensorParallelModel: another pipeline stage refused the plan '",
               plan_.name, "'");
  const bool overStages = stages && stages->size() > 1 && samePlan;
  for (size_t e = 0; e < plan_.styles.size(); ++e)
    KOLO_REQUIRE(counts[e] > 0, "tensor-parallel plan '", plan_.name, "': the pattern '",
                 plan_.styles[e].first, "' (", styleName(plan_.styles[e].second),
                 ") matches no module of the model", overStages ? " on any stage" : "");
  KOLO_REQUIRE(counts[counts.size() - 2] > 0, "tensor-parallel plan '", plan_.name,
               "' splits no parameter of the model: ",
               plan_.styles.empty() ? "it has no entries"
                                    : "its patterns match only replicated modules and norms",
               " (every rank would hold the whole model; name the modules to split by their "
               "paths, e.g. \"*.attn.q\" column-wise)");

  detail::SplitContext context{.comm = comm_, .sequenceParallel = plan_.sequenceParallel};
  for (const Match& m : matches) {
    detail::applyStyle(m.path, *m.module, plan_.styles[m.entry].second, context);
    split_.emplace_back(m.path, styleName(plan_.styles[m.entry].second));
  }
  specs_ = std::move(context.specs);
  sequenceParameters_ = std::move(context.sequenceParameters);
  vocabularyOutput_ = context.vocabularyOutput;
  reached_ = std::move(context.reached);
  reachedChecked_ = stages != nullptr && stages->size() > 1;  // the engine checks each stage
}

void TensorParallelModel::checkSharedTensors(const std::vector<Match>& matches) const {
  // A tensor held by two modules (a tied embedding and head) is one shard on each rank, so
  // every module that holds it must be split, and split alike: otherwise a replicated module
  // would compute with a shard.
  struct Split {
    std::string name, path, style;
    ShardSpec spec;
  };
  std::map<const TensorImpl*, Split> byTensor;
  std::set<std::string> names;
  for (const Match& m : matches) {
    const ParallelStyle& style = plan_.styles[m.entry].second;
    for (const detail::PlannedSplit& split : detail::plannedSplits(m.path, *m.module, style)) {
      names.insert(split.name);
      const auto [at, fresh] =
          byTensor.emplace(split.tensor.impl(), Split{split.name, m.path, styleName(style), split.spec});
      KOLO_REQUIRE(fresh || (at->second.spec.dim == split.spec.dim && at->second.spec.blocks == split.spec.blocks),
                   "tensor-parallel plan '", plan_.name, "': '", split.name, "' (module '", m.path, "', ",
                   styleName(style), ") is the same tensor as '", at->second.name, "' (module '", at->second.path,
                   "', ", at->second.style, "), which is split another way");
    }
  }
  for (const auto& [name, t] : model_->stateDict()) {
    const auto at = byTensor.find(t.impl());
    if (at == byTensor.end() || names.count(name)) continue;
    const size_t dot = name.rfind('.');
    KOLO_THROW(InvalidArgument, "tensor-parallel plan '", plan_.name, "': '", name, "' is the same tensor as '",
               at->second.name, "', which module '", at->second.path, "' splits (", at->second.style,
               "), but the plan does not split module '", dot == std::string::npos ? std::string() : name.substr(0, dot),
               "' alike (a tied embedding and head: vocabularyEmbedding() for the table, vocabularyHead() "
               "for the head)");
  }
}

void TensorParallelModel::requireReached(nn::Module* part) const {
  std::set<std::string> inPart;
  if (part)
    for (const auto& [path, module] : part->namedModules()) inPart.insert(path);
  for (const auto& [path, calls] : reached_)
    KOLO_REQUIRE(*calls > 0 || (part && !inPart.count(path)), "tensor-parallel plan '", plan_.name, "': module '", path,
                 "' was split but no forward reached it through operator(), where its "
                 "communication runs (a model must call its children as (*child)(x), not "
                 "child->forward(x); a module the model never calls must not be in the plan)");
}

void TensorParallelModel::synchronizeGradients() {
  if (sequenceParameters_.empty()) return;
  // One all-reduce of the gradients packed together.
  int64_t total = 0;
  for (const Tensor& p : sequenceParameters_) total += p.numel();
  Tensor packed = Tensor::zeros({total}, DType::F32);
  float* at = packed.data<float>();
  for (const Tensor& p : sequenceParameters_) {
    const Tensor g = p.grad();
    if (g.defined()) {
      const Tensor values = g.to(DType::F32).contiguous();
      std::copy(values.data<float>(), values.data<float>() + values.numel(), at);
    }
    at += p.numel();
  }
  comm_->allreduce(packed.rawData(), packed.rawData(), static_cast<size_t>(total), DType::F32,
                   comm::ReduceOp::Sum);
  int64_t offset = 0;
  for (Tensor& p : sequenceParameters_) {
    const Tensor sum = packed.slice(0, offset, offset + p.numel()).reshape(p.shape());
    offset += p.numel();
    Tensor g = p.grad();
    if (g.defined()) {
      g.copyFrom(sum);
    } else {
      p.setGrad(sum.to(p.dtype()).contiguous().clone());
    }
  }
}

Tensor TensorParallelModel::loss(const Tensor& output, const Tensor& targets) {
  if (!reachedChecked_) {
    requireReached();
    reachedChecked_ = true;
  }
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
  for (const auto& [name, local] : model_->namedParameters()) {
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
