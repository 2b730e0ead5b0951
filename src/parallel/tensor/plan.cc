// The styles a tensor-parallel plan names, and the default plan: kolo's own building blocks
// (the lm's embedding, transformer blocks and head; Linear pairs in a Sequential) written as
// a plan like any user's, found by walking the module tree.
#include <set>

#include "kolo/nn/attention.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/llama.h"
#include "kolo/parallel/tensor_parallel.h"

namespace kolo::parallel {

ParallelStyle columnWise(bool gatherOutput, int blocks) {
  return {.kind = ParallelStyle::Kind::ColumnWise, .gatherOutput = gatherOutput, .blocks = blocks};
}
ParallelStyle rowWise() { return {.kind = ParallelStyle::Kind::RowWise}; }
ParallelStyle columnWiseHeads(int64_t headDim) {
  return {.kind = ParallelStyle::Kind::ColumnWise, .unit = headDim};
}
ParallelStyle rowWiseHeads(int64_t headDim) {
  return {.kind = ParallelStyle::Kind::RowWise, .unit = headDim};
}
ParallelStyle vocabularyEmbedding() { return {.kind = ParallelStyle::Kind::VocabularyEmbedding}; }
ParallelStyle vocabularyHead() { return {.kind = ParallelStyle::Kind::VocabularyHead}; }
ParallelStyle sequenceNorm() { return {.kind = ParallelStyle::Kind::SequenceNorm}; }
ParallelStyle replicated() { return {.kind = ParallelStyle::Kind::Replicated}; }
ParallelStyle attentionHeads() { return {.kind = ParallelStyle::Kind::AttentionHeads}; }

std::string styleName(const ParallelStyle& style) {
  using Kind = ParallelStyle::Kind;
  switch (style.kind) {
    case Kind::ColumnWise:
      return std::string("column-wise") + (style.gatherOutput ? ", gathered" : "") +
             (style.blocks > 1 ? ", " + std::to_string(style.blocks) + " blocks" : "") +
             (style.unit > 1 ? ", heads of " + std::to_string(style.unit) : "");
    case Kind::RowWise:
      return std::string("row-wise") + (style.unit > 1 ? ", heads of " + std::to_string(style.unit) : "");
    case Kind::VocabularyEmbedding:
      return "vocabulary-parallel embedding";
    case Kind::VocabularyHead:
      return "vocabulary-parallel head";
    case Kind::SequenceNorm:
      return "sequence-parallel norm";
    case Kind::Replicated:
      return "replicated";
    case Kind::AttentionHeads:
      return "attention by heads";
  }
  return "?";
}

namespace {

bool elementwise(const nn::Module& m) {
  return dynamic_cast<const nn::ReLU*>(&m) || dynamic_cast<const nn::GELU*>(&m) ||
         dynamic_cast<const nn::Tanh*>(&m) || dynamic_cast<const nn::SiLU*>(&m);
}

bool plainLinear(const nn::Module& m) {
  return dynamic_cast<const nn::Linear*>(&m) && !dynamic_cast<const nn::LanguageModelHead*>(&m);
}

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

}  // namespace

TensorParallelPlan defaultPlan(const nn::Module& model) {
  TensorParallelPlan plan;
  plan.name = "default";
  auto& styles = plan.styles;
  std::set<std::string> inBlocks;  // the mlps of transformer blocks, planned with the block
  // namedModules() is not const; the walk only reads.
  const auto modules = const_cast<nn::Module&>(model).namedModules();
  std::set<const TensorImpl*> headTables;  // an embedding that shares one is split as the head
  for (const auto& [path, module] : modules)
    if (const auto* head = dynamic_cast<const nn::LanguageModelHead*>(module)) headTables.insert(head->weight.impl());
  for (const auto& [path, module] : modules) {
    const auto* embedding = dynamic_cast<const nn::Embedding*>(module);
    if (dynamic_cast<const nn::TokenPositionEmbedding*>(module) || dynamic_cast<const nn::TokenEmbedding*>(module) ||
        (embedding && headTables.count(embedding->weight.impl()))) {
      styles.emplace_back(path, vocabularyEmbedding());
    } else if (dynamic_cast<const nn::TransformerBlock*>(module)) {
      styles.emplace_back(join(path, "ln1"), sequenceNorm());
      styles.emplace_back(join(path, "attn"), attentionHeads());
      styles.emplace_back(join(path, "ln2"), sequenceNorm());
      styles.emplace_back(join(path, "mlp.0"), columnWise());
      styles.emplace_back(join(path, "mlp.2"), rowWise());
      inBlocks.insert(join(path, "mlp"));
    } else if (dynamic_cast<const nn::LlamaBlock*>(module)) {
      styles.emplace_back(join(path, "attn_norm"), sequenceNorm());
      styles.emplace_back(join(path, "mlp_norm"), sequenceNorm());
    } else if (dynamic_cast<const nn::GroupedQueryAttention*>(module)) {
      styles.emplace_back(path, attentionHeads());
    } else if (dynamic_cast<const nn::SwiGLU*>(module)) {
      styles.emplace_back(join(path, "gate"), columnWise());
      styles.emplace_back(join(path, "up"), columnWise());
      styles.emplace_back(join(path, "down"), rowWise());
    } else if (dynamic_cast<const nn::LanguageModelHead*>(module)) {
      styles.emplace_back(path, vocabularyHead());
    } else if ((dynamic_cast<const nn::LayerNorm*>(module) || dynamic_cast<const nn::RMSNorm*>(module)) &&
               !path.empty() && path.find('.') == std::string::npos) {
      styles.emplace_back(path, sequenceNorm());  // a norm of the root's residual stream
    } else if (const auto* sequential = dynamic_cast<const nn::Sequential*>(module);
               sequential && !inBlocks.count(path)) {
      // Linear, element-wise layers only, Linear: column- then row-wise.
      const auto& layers = sequential->children();
      for (size_t i = 0; i < layers.size(); ++i) {
        if (!plainLinear(*layers[i].second)) continue;
        size_t j = i + 1;
        while (j < layers.size() && elementwise(*layers[j].second)) ++j;
        if (j == layers.size() || !plainLinear(*layers[j].second)) continue;
        styles.emplace_back(join(path, layers[i].first), columnWise());
        styles.emplace_back(join(path, layers[j].first), rowWise());
        i = j;
      }
    }
  }
  return plan;
}

}  // namespace kolo::parallel
