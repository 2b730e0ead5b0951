// The byte-level `lm` model, its loss and sampling from it.
#include "kolo/nn/language_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kolo/autograd.h"
#include "kolo/nn/llama.h"
#include "kolo/ops.h"

namespace kolo::nn {

TokenPositionEmbedding::TokenPositionEmbedding(int64_t vocab, int64_t dim, int64_t maxLen, Generator& gen)
    : maxLen_(maxLen) {
  tok_ = registerModule("tok", std::make_shared<Embedding>(vocab, dim, gen));
  pos_ = registerModule("pos", std::make_shared<Embedding>(maxLen, dim, gen));
}

Tensor TokenPositionEmbedding::forward(const Tensor& ids) {
  KOLO_REQUIRE(ids.dim() == 2, "TokenPositionEmbedding: input ", shapeString(ids.shape()),
               " is not (B, T) token ids");
  const int64_t t = ids.shape()[1];
  KOLO_REQUIRE(t <= maxLen_, "TokenPositionEmbedding: sequence of ", t,
               " tokens is longer than the position table (", maxLen_, ")");
  std::vector<int64_t> positions(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) positions[static_cast<size_t>(i)] = i;
  const Tensor where = Tensor::fromVector({t}, positions);
  // The children through operator(), so that their hooks and transforms apply (a
  // vocabulary-parallel token table's, say).
  return (*tok_)(ids) + (*pos_)(where);  // (B, T, C) + (T, C)
}

std::shared_ptr<Sequential> makeLanguageModel(const LanguageModelConfig& config, Generator& gen) {
  return makeLanguageModelPart(config, gen, 0, config.layers + 3);
}

const char* languageModelArchName(LanguageModelArch arch) {
  return arch == LanguageModelArch::Llama ? "llama" : "gpt";
}

LanguageModelArch parseLanguageModelArch(const std::string& name) {
  if (name == "gpt") return LanguageModelArch::Gpt;
  if (name == "llama") return LanguageModelArch::Llama;
  KOLO_THROW(InvalidArgument, "lm: unknown architecture '", name, "' (gpt or llama)");
}

std::shared_ptr<Sequential> makeLanguageModelPart(const LanguageModelConfig& config, Generator& gen,
                                                  int64_t keepBegin, int64_t keepEnd) {
  KOLO_REQUIRE(config.vocab > 0 && config.layers > 0 && config.dModel > 0 && config.heads > 0 &&
                   config.seqLen > 0,
               "lm: vocab ", config.vocab, ", layers ", config.layers, ", d-model ", config.dModel,
               ", heads ", config.heads, " and seq-len ", config.seqLen, " must all be at least 1");
  KOLO_REQUIRE(config.dModel % config.heads == 0, "lm: LanguageModelConfig::dModel ", config.dModel,
               " is not divisible by LanguageModelConfig::heads ", config.heads);
  const int64_t kvHeads = config.kvHeads > 0 ? config.kvHeads : config.heads;
  KOLO_REQUIRE(config.arch != LanguageModelArch::Llama || config.heads % kvHeads == 0,
               "lm: LanguageModelConfig::kvHeads ", kvHeads, " does not divide LanguageModelConfig::heads ",
               config.heads);
  const int64_t count = config.layers + 3;
  KOLO_REQUIRE(keepBegin >= 0 && keepBegin < keepEnd && keepEnd <= count, "lm: layers [", keepBegin, ", ",
               keepEnd, ") are not inside the model's ", count);
  auto model = std::make_shared<Sequential>();
  auto keep = [&](std::shared_ptr<Module> layer) {
    const int64_t i = static_cast<int64_t>(model->size());
    model->add(i >= keepBegin && i < keepEnd ? std::move(layer) : std::make_shared<Sequential>());
  };
  if (config.arch == LanguageModelArch::Gpt) {
    keep(std::make_shared<TokenPositionEmbedding>(config.vocab, config.dModel, config.seqLen, gen));
    for (int64_t i = 0; i < config.layers; ++i)
      keep(std::make_shared<TransformerBlock>(config.dModel, config.heads, gen));
    keep(std::make_shared<LayerNorm>(Shape{config.dModel}));
    keep(std::make_shared<LanguageModelHead>(config.dModel, config.vocab, gen));
    return model;
  }
  // N(0, 1/C) rather than N(0, 1): the tied head's logits then start near unit scale.
  auto embedding = std::make_shared<TokenEmbedding>(config.vocab, config.dModel, gen);
  embedding->weight.copyFrom(embedding->weight * (1.0 / std::sqrt(static_cast<double>(config.dModel))));
  const bool embeddingKept = keepBegin == 0;
  // The head shares the table when this part holds both; otherwise it starts from a copy.
  Tensor table = embeddingKept ? embedding->weight : embedding->weight.detach().clone();
  keep(std::move(embedding));
  const LlamaBlockConfig block{.dim = config.dModel, .heads = config.heads, .kvHeads = kvHeads,
                               .ropeTheta = config.ropeTheta};
  for (int64_t i = 0; i < config.layers; ++i) keep(std::make_shared<LlamaBlock>(block, gen));
  keep(std::make_shared<RMSNorm>(config.dModel));
  keep(std::make_shared<LanguageModelHead>(std::move(table)));
  return model;
}

Tensor languageModelLoss(const Tensor& logits, const Tensor& targets) {
  KOLO_REQUIRE(logits.dim() >= 2 && logits.numel() / logits.shape().back() == targets.numel(),
               "languageModelLoss: logits ", shapeString(logits.shape()), " do not match targets ",
               shapeString(targets.shape()));
  const int64_t v = logits.shape().back();
  return crossEntropy(logits.reshape({-1, v}), targets.reshape({-1}));
}

std::string generateText(Module& model, const std::string& prompt, int64_t count, int64_t context,
                         double temperature, Generator& gen) {
  KOLO_REQUIRE(!prompt.empty(), "generateText: the prompt is empty");
  KOLO_REQUIRE(context > 0, "generateText: context must be at least 1, got ", context);
  autograd::NoGradGuard noGrad;
  model.train(false);
  std::string text = prompt;
  for (int64_t i = 0; i < count; ++i) {
    const size_t start = text.size() > static_cast<size_t>(context) ? text.size() - static_cast<size_t>(context) : 0;
    std::vector<int64_t> ids;
    for (size_t j = start; j < text.size(); ++j) ids.push_back(static_cast<unsigned char>(text[j]));
    const int64_t t = static_cast<int64_t>(ids.size());
    const Tensor logits = model.forward(Tensor::fromVector({1, t}, ids));  // (1, T, V)
    const std::vector<double> last = logits.slice(1, t - 1, t).reshape({-1}).toDoubleVector();
    size_t next = 0;
    if (temperature <= 0.0) {
      next = static_cast<size_t>(std::max_element(last.begin(), last.end()) - last.begin());
    } else {
      const double top = *std::max_element(last.begin(), last.end());
      std::vector<double> weights(last.size());
      double total = 0.0;
      for (size_t j = 0; j < last.size(); ++j) total += weights[j] = std::exp((last[j] - top) / temperature);
      double pick = gen.uniform() * total;
      next = weights.size() - 1;
      for (size_t j = 0; j < weights.size(); ++j) {
        pick -= weights[j];
        if (pick < 0.0) {
          next = j;
          break;
        }
      }
    }
    text.push_back(static_cast<char>(static_cast<unsigned char>(next)));
  }
  return text;
}

}  // namespace kolo::nn
