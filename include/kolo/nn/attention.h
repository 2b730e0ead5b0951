// Causal multi-head self-attention and a pre-LayerNorm transformer block (GPT-2 style),
// built from the differentiable ops; inputs are (B, T, C).
#pragma once

#include "kolo/nn/layers.h"

namespace kolo::nn {

/// Multi-head attention where position t attends to positions <= t. Parameters:
/// "qkv" Linear(C, 3C) and "proj" Linear(C, C), called through operator() (their hooks fire).
/// The head size C/numHeads is fixed and the heads computed follow from qkv's output width,
/// so a tensor-parallel plan that splits qkv by heads (q, k and v blocks each) and proj by
/// its input features makes each rank compute its share of the heads (parallel::attentionHeads).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embedDim, int64_t numHeads, Generator& gen);
  using Module::forward;
  /// x (B, T, C) -> (B, T, C).
  Tensor forward(const Tensor& x) override;
  /// As forward(x), where position t also attends only to the positions s with
  /// mask[..., t, s] nonzero (a padding mask, say; true = may attend, as the attn_mask of
  /// torch's scaled_dot_product_attention). mask is (T, T), (B, T, T) or (B, H, T, T) of any
  /// dtype and is not differentiated; an undefined mask is the causal path alone. A position
  /// left with no key to attend to gets NaN, as in PyTorch. Throws InvalidArgument for
  /// another mask shape.
  Tensor forward(const Tensor& x, const Tensor& mask);
  int64_t embedDim() const { return embedDim_; }
  int64_t numHeads() const { return numHeads_; }

 protected:
  /// {x} or {x, mask}.
  Tensor forwardInputs(const std::vector<Tensor>& inputs) override;

 private:
  int64_t embedDim_, numHeads_;
  std::shared_ptr<Linear> qkv_, proj_;
};

/// x + attn(ln1(x)), then + mlp(ln2(.)) with mlp = Linear(C, hidden) - GELU - Linear(hidden, C)
/// (hidden defaults to 4C). Children: "ln1", "attn", "ln2", "mlp" ("mlp.0", "mlp.2"); forward
/// calls them through operator(), so their hooks fire. It runs mlp.0 and the GELU as one op
/// (linearGelu) while "mlp", "mlp.0" and "mlp.1" have no hooks or transforms (Module::hasHooks),
/// and the mlp through operator() when they do.
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t embedDim, int64_t numHeads, Generator& gen, int64_t hidden = -1);
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  /// The block with the attention mask of CausalSelfAttention::forward(x, mask).
  Tensor forward(const Tensor& x, const Tensor& mask);

 protected:
  /// {x} or {x, mask}.
  Tensor forwardInputs(const std::vector<Tensor>& inputs) override;

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Sequential> mlp_;
};

}  // namespace kolo::nn
