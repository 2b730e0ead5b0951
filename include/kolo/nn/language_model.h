// The `lm` model: a byte-level decoder-only transformer (GPT-2 style, pre-LayerNorm) built
// from kolo's own layers as a Sequential, so that a pipeline can cut it between any two of
// its children: token + position embedding, N transformer blocks, final LayerNorm, and an
// untied output head.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kolo/nn/attention.h"
#include "kolo/nn/layers.h"

namespace kolo::nn {

/// The blocks an `lm` is built from. Gpt: learned positions, pre-LayerNorm blocks with
/// biases, a 4C GELU MLP and an untied head (GPT-2). Llama: no position table but rotary
/// positions in the attention, RMSNorm, grouped-query attention, a SwiGLU MLP of
/// swigluHidden(dModel), no biases, and the head tied to the token embedding (LLaMA).
enum class LanguageModelArch { Gpt, Llama };

/// "gpt" or "llama"; parseLanguageModelArch throws InvalidArgument naming another word.
const char* languageModelArchName(LanguageModelArch arch);
LanguageModelArch parseLanguageModelArch(const std::string& name);

/// Sizes of the `lm` model (`kolo train --model lm --arch --layers --d-model --heads
/// --kv-heads --seq-len`).
struct LanguageModelConfig {
  int64_t vocab = 256;  // byte-level
  int64_t layers = 4;
  int64_t dModel = 128;
  int64_t heads = 4;
  int64_t seqLen = 64;  // the longest context (gpt: rows of the position table)
  LanguageModelArch arch = LanguageModelArch::Gpt;
  int64_t kvHeads = 0;        // llama: key/value heads, dividing heads; 0: as many as heads
  double ropeTheta = 10000.0;  // llama: the base of the rotary positions
};

/// Token ids (B, T) of any integer dtype -> tok(ids) + pos(0..T-1), (B, T, C) in f32.
/// Children "tok" [vocab, C] and "pos" [maxLen, C], both Embedding (N(0, 1)). Throws
/// InvalidArgument for T above maxLen or an input that is not (B, T).
class TokenPositionEmbedding : public Module {
 public:
  TokenPositionEmbedding(int64_t vocab, int64_t dim, int64_t maxLen, Generator& gen);
  using Module::forward;
  Tensor forward(const Tensor& ids) override;
  const std::shared_ptr<Embedding>& tokens() const { return tok_; }
  const std::shared_ptr<Embedding>& positions() const { return pos_; }

 private:
  int64_t maxLen_;
  std::shared_ptr<Embedding> tok_, pos_;
};

/// The token table of the llama `lm` (its layer 0): an Embedding(vocab, dModel), a type of its
/// own so that tensor parallelism finds it and splits it by vocabulary, as the head that shares
/// its table (parallel::defaultPlan).
class TokenEmbedding : public Embedding {
 public:
  TokenEmbedding(int64_t vocab, int64_t dModel, Generator& gen) : Embedding(vocab, dModel, gen) {}
};

/// The output head of the `lm`: Linear(dModel, vocab) without bias, a type of its own so that
/// tensor parallelism finds it and splits it by vocabulary (parallel::TensorParallelModel).
class LanguageModelHead : public Linear {
 public:
  LanguageModelHead(int64_t dModel, int64_t vocab, Generator& gen)
      : Linear(dModel, vocab, gen, false) {}
  /// A head over `weight` [vocab, dModel]: the token embedding's table itself (tied
  /// embeddings, one parameter), or a copy of it on a pipeline stage that does not hold the
  /// embedding.
  explicit LanguageModelHead(Tensor weight) : Linear(std::move(weight)) {}
};

/// The `lm` model. Gpt: children "0" TokenPositionEmbedding, "1" ... "L" TransformerBlock(dModel,
/// heads), "L+1" LayerNorm(dModel), "L+2" LanguageModelHead(dModel, vocab). Llama: "0"
/// TokenEmbedding(vocab, dModel) drawn N(0, 1/dModel), "1" ... "L" LlamaBlock (dModel, heads,
/// kvHeads, ropeTheta), "L+1" RMSNorm(dModel), "L+2" LanguageModelHead over child 0's table
/// (one parameter, "0.weight" in namedParameters(); the state dict also names it
/// "L+2.weight", as PyTorch's does). Maps ids (B, T) to logits (B, T, vocab). Parameters are
/// drawn from gen in registration order. Throws InvalidArgument for a size below 1, dModel
/// not divisible by heads, or kvHeads not dividing heads.
std::shared_ptr<Sequential> makeLanguageModel(const LanguageModelConfig& config, Generator& gen);

/// The layers [keepBegin, keepEnd) of makeLanguageModel(config, gen) with the same values,
/// the others replaced by empty Sequential placeholders: every layer is drawn from gen in
/// order and those outside the range are dropped as soon as they are made, so a pipeline
/// stage never holds the whole model. Throws as makeLanguageModel, and InvalidArgument for
/// a range outside [0, layers + 3). A llama part that holds the head but not the embedding
/// gives the head a copy of the embedding's initial table: a pipeline must then sum the two
/// copies' gradients (parallel::tiedParameters finds them).
std::shared_ptr<Sequential> makeLanguageModelPart(const LanguageModelConfig& config, Generator& gen,
                                                  int64_t keepBegin, int64_t keepEnd);

/// Next-token cross-entropy: the mean over all B*T positions of -log softmax(logits)[target].
/// logits (B, T, V) (or (N, V)), targets (B, T) (or (N)) of i64.
Tensor languageModelLoss(const Tensor& logits, const Tensor& targets);

/// Continues `prompt` (bytes) by `count` bytes sampled from `model` (a makeLanguageModel
/// model) at `temperature` (0: greedy), feeding it at most the last `context` bytes. No
/// autograd is recorded; the model is left in eval mode.
std::string generateText(Module& model, const std::string& prompt, int64_t count, int64_t context,
                         double temperature, Generator& gen);

}  // namespace kolo::nn
