// The blocks of LLaMA-style decoder transformers (LLaMA, Mistral, Qwen): RMSNorm, SiLU, the
// SwiGLU MLP, causal attention with rotary positions and grouped key/value heads over
// bias-free q, k, v, o projections, and the pre-norm block that joins them. Inputs are
// (B, T, C). Each module's children are ordinary Linear layers, so a tensor-parallel plan can
// split them by path (column-wise q, k, v, gate, up; row-wise o, down).
#pragma once

#include <optional>

#include "kolo/nn/layers.h"
#include "kolo/ops.h"

namespace kolo::nn {

/// x / sqrt(mean(x^2) + eps) * weight over the last dimension (torch.nn.RMSNorm). Parameter
/// "weight" [dim], ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  Tensor weight;

 private:
  int64_t dim_;
  double eps_;
};

/// x * sigmoid(x) (torch.nn.SiLU).
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// down(silu(gate(x)) * up(x)), children "gate" Linear(dim, hidden), "up" Linear(dim, hidden)
/// and "down" Linear(hidden, dim), all without bias, called through operator() (their hooks
/// fire); the gate is one op (ops.h swiglu). The hidden width is read from the projections'
/// outputs, so that gate and up split column-wise and down row-wise need no other change.
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden, Generator& gen);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<Linear> gate_, up_, down_;
};

/// The hidden width of a LLaMA MLP for model width `dim`: 8/3 of it, to the nearest multiple
/// of `multiple` (64 by default; at least one multiple).
int64_t swigluHidden(int64_t dim, int64_t multiple = 64);

/// Causal self-attention with grouped key/value heads and rotary positions: children "q"
/// Linear(dim, heads*headDim), "k" and "v" Linear(dim, kvHeads*headDim), "o"
/// Linear(heads*headDim, dim), all without bias. forward(x) runs the projections through
/// operator(), then ops.h causalAttention(q, k, v, headDim, rotary) and "o". The numbers of
/// heads are read from the projections' output widths (as torchtitan's view(bs, seqlen, -1,
/// head_dim)), so q, k and v split column-wise on head boundaries and o row-wise make the
/// module tensor-parallel unchanged; heads() and kvHeads() are the whole model's.
class GroupedQueryAttention : public Module {
 public:
  /// kvHeads must divide heads (kvHeads = heads: multi-head; 1: multi-query); rotary nullopt:
  /// no position rotation. Throws InvalidArgument otherwise, or for an odd headDim with rotary.
  GroupedQueryAttention(int64_t dim, int64_t heads, int64_t kvHeads, int64_t headDim, Generator& gen,
                        std::optional<Rotary> rotary = Rotary{});
  /// x (B, T, dim) -> (B, T, dim).
  Tensor forward(const Tensor& x) override;
  int64_t headDim() const { return headDim_; }
  int64_t heads() const { return heads_; }
  int64_t kvHeads() const { return kvHeads_; }
  const std::optional<Rotary>& rotary() const { return rotary_; }

 private:
  int64_t headDim_, heads_, kvHeads_;
  std::optional<Rotary> rotary_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
};

/// Sizes of a LlamaBlock.
struct LlamaBlockConfig {
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t kvHeads = 4;     // dividing heads
  int64_t hidden = -1;     // the MLP's width; -1: swigluHidden(dim)
  double normEps = 1e-5;
  double ropeTheta = 10000.0;
};

/// x + attn(attn_norm(x)), then + mlp(mlp_norm(.)): children "attn_norm" RMSNorm, "attn"
/// GroupedQueryAttention (headDim = dim / heads, rotary with ropeTheta), "mlp_norm" RMSNorm,
/// "mlp" SwiGLU, each called through operator(). Throws InvalidArgument when heads does not
/// divide dim or kvHeads does not divide heads.
class LlamaBlock : public Module {
 public:
  LlamaBlock(const LlamaBlockConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<RMSNorm> attnNorm_, mlpNorm_;
  std::shared_ptr<GroupedQueryAttention> attn_;
  std::shared_ptr<SwiGLU> mlp_;
};

}  // namespace kolo::nn
