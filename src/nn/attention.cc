// Causal multi-head self-attention and the pre-LN transformer block.
#include "kolo/nn/attention.h"

#include <cmath>
#include <limits>

#include "kolo/ops.h"

namespace kolo::nn {

namespace {
// The attention mask as a shape that broadcasts against the scores (B, H, T, T).
Tensor headMask(const Tensor& mask, int64_t b, int64_t h, int64_t t) {
  const Shape& s = mask.shape();
  const bool square = mask.dim() >= 2 && s[mask.dim() - 1] == t && s[mask.dim() - 2] == t;
  if (square && mask.dim() == 2) return mask;                                     // (T, T)
  if (square && mask.dim() == 3 && s[0] == b) return mask.reshape({b, 1, t, t});  // (B, 1, T, T)
  if (square && mask.dim() == 4 && s[0] == b && s[1] == h) return mask;           // (B, H, T, T)
  KOLO_THROW(InvalidArgument, "CausalSelfAttention: mask ", shapeString(s),
             " is not (T, T), (B, T, T) or (B, H, T, T) with B=", b, ", H=", h, ", T=", t);
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(int64_t embedDim, int64_t numHeads, Generator& gen)
    : embedDim_(embedDim), numHeads_(numHeads) {
  KOLO_REQUIRE(numHeads > 0 && embedDim % numHeads == 0, "CausalSelfAttention: embedDim ", embedDim,
               " not divisible by numHeads ", numHeads);
  qkv_ = registerModule("qkv", std::make_shared<Linear>(embedDim, 3 * embedDim, gen));
  proj_ = registerModule("proj", std::make_shared<Linear>(embedDim, embedDim, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor CausalSelfAttention::forwardInputs(const std::vector<Tensor>& inputs) {
  KOLO_REQUIRE(inputs.size() == 1 || inputs.size() == 2,
               "CausalSelfAttention takes x or x and mask, got ", inputs.size(), " inputs");
  return forward(inputs[0], inputs.size() == 2 ? inputs[1] : Tensor());
}

Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& mask) {
  KOLO_REQUIRE(x.dim() == 3 && x.shape()[2] == embedDim_, "CausalSelfAttention: input ", shapeString(x.shape()),
               " is not (B, T, ", embedDim_, ")");
  Tensor qkv = (*qkv_)(x);  // (B, T, 3C); the children through operator(), so their hooks fire
  // The heads this module computes follow from qkv's width at the fixed head size: all of
  // them, or a tensor-parallel rank's share when qkv is split by heads (then C/T below).
  const int64_t hd = embedDim_ / numHeads_, h = qkv.shape()[2] / (3 * hd), c = h * hd;
  const int64_t b = x.shape()[0], t = x.shape()[1];
  // The causal path alone is one fused op; a further mask goes through the separate ops.
  if (!mask.defined()) return (*proj_)(causalAttention(qkv, h));  // (B, T, C)
  auto head = [&](int64_t i) {    // (B, H, T, hd)
    return qkv.slice(2, i * c, (i + 1) * c).reshape({b, t, h, hd}).transpose(1, 2);
  };
  Tensor q = head(0), k = head(1), v = head(2);
  Tensor att = matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));  // (B, H, T, T)
  const Tensor minusInf = Tensor::scalar(-std::numeric_limits<double>::infinity(), att.dtype());
  att = where(trilMask(t), att, minusInf);
  if (mask.defined()) att = where(headMask(mask, b, h, t), att, minusInf);
  att = softmax(att, -1);
  Tensor y = matmul(att, v);                       // (B, H, T, hd)
  y = y.transpose(1, 2).reshape({b, t, c});        // (B, T, C)
  return (*proj_)(y);
}

TransformerBlock::TransformerBlock(int64_t embedDim, int64_t numHeads, Generator& gen, int64_t hidden) {
  if (hidden <= 0) hidden = 4 * embedDim;
  ln1_ = registerModule("ln1", std::make_shared<LayerNorm>(Shape{embedDim}));
  attn_ = registerModule("attn", std::make_shared<CausalSelfAttention>(embedDim, numHeads, gen));
  ln2_ = registerModule("ln2", std::make_shared<LayerNorm>(Shape{embedDim}));
  auto mlp = std::make_shared<Sequential>();
  mlp->add(std::make_shared<Linear>(embedDim, hidden, gen));
  mlp->add(std::make_shared<GELU>());
  mlp->add(std::make_shared<Linear>(hidden, embedDim, gen));
  mlp_ = registerModule("mlp", mlp);
}

Tensor TransformerBlock::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor TransformerBlock::forwardInputs(const std::vector<Tensor>& inputs) {
  KOLO_REQUIRE(inputs.size() == 1 || inputs.size() == 2,
               "TransformerBlock takes x or x and mask, got ", inputs.size(), " inputs");
  return forward(inputs[0], inputs.size() == 2 ? inputs[1] : Tensor());
}

Tensor TransformerBlock::forward(const Tensor& x, const Tensor& mask) {
  // The children through operator(), so that their hooks fire (as PyTorch's submodule calls
  // do); mlp.0 and the GELU as one op (bias and activation in one pass), then mlp.2.
  const Tensor normed = (*ln1_)(x);
  Tensor h = x + (mask.defined() ? (*attn_)(normed, mask) : (*attn_)(normed));
  Module& fc1 = *mlp_->children()[0].second;
  Module& gelu = *mlp_->children()[1].second;
  Module& fc2 = *mlp_->children()[2].second;
  // A hook or transform on mlp.0 or the GELU (a tensor-parallel plan's) must see its call:
  // then the separate ops, through operator().
  if (fc1.hasHooks() || gelu.hasHooks() || mlp_->hasHooks()) return h + (*mlp_)((*ln2_)(h));
  const auto& linear = static_cast<const Linear&>(fc1);
  return h + fc2(linearGelu((*ln2_)(h), linear.weight, linear.bias));
}

}  // namespace kolo::nn
