// The LLaMA-style blocks: RMSNorm, SiLU, SwiGLU, grouped-query attention with rotary
// positions, and the pre-norm block.
#include "kolo/nn/llama.h"

#include <cmath>

namespace kolo::nn {

RMSNorm::RMSNorm(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  KOLO_REQUIRE(dim > 0, "RMSNorm(", dim, "): size must be positive");
  weight = registerParameter("weight", Tensor::ones({dim}));
}

Tensor RMSNorm::forward(const Tensor& x) {
  KOLO_REQUIRE(x.dim() >= 1 && x.shape().back() == dim_, "RMSNorm(", dim_, "): input ", shapeString(x.shape()),
               " does not end with ", dim_, " features");
  return rmsNorm(x, weight, eps_);
}

Tensor SiLU::forward(const Tensor& x) { return silu(x); }

SwiGLU::SwiGLU(int64_t dim, int64_t hidden, Generator& gen) {
  gate_ = registerModule("gate", std::make_shared<Linear>(dim, hidden, gen, false));
  up_ = registerModule("up", std::make_shared<Linear>(dim, hidden, gen, false));
  down_ = registerModule("down", std::make_shared<Linear>(hidden, dim, gen, false));
}

Tensor SwiGLU::forward(const Tensor& x) { return (*down_)(swiglu((*gate_)(x), (*up_)(x))); }

int64_t swigluHidden(int64_t dim, int64_t multiple) {
  KOLO_REQUIRE(dim > 0 && multiple > 0, "swigluHidden: width ", dim, " and multiple ", multiple,
               " must be positive");
  const double target = 8.0 * static_cast<double>(dim) / 3.0;
  const int64_t nearest = static_cast<int64_t>(std::llround(target / static_cast<double>(multiple))) * multiple;
  return nearest > 0 ? nearest : multiple;
}

GroupedQueryAttention::GroupedQueryAttention(int64_t dim, int64_t heads, int64_t kvHeads, int64_t headDim,
                                             Generator& gen, std::optional<Rotary> rotary)
    : headDim_(headDim), heads_(heads), kvHeads_(kvHeads), rotary_(rotary) {
  KOLO_REQUIRE(dim > 0 && heads > 0 && kvHeads > 0 && headDim > 0, "GroupedQueryAttention: width ", dim,
               ", heads ", heads, ", key/value heads ", kvHeads, " and head size ", headDim,
               " must all be positive");
  KOLO_REQUIRE(heads % kvHeads == 0, "GroupedQueryAttention: ", kvHeads, " key/value heads do not divide ", heads,
               " query heads");
  KOLO_REQUIRE(!rotary || headDim % 2 == 0, "GroupedQueryAttention: rotary positions need an even head size, got ",
               headDim);
  q_ = registerModule("q", std::make_shared<Linear>(dim, heads * headDim, gen, false));
  k_ = registerModule("k", std::make_shared<Linear>(dim, kvHeads * headDim, gen, false));
  v_ = registerModule("v", std::make_shared<Linear>(dim, kvHeads * headDim, gen, false));
  o_ = registerModule("o", std::make_shared<Linear>(heads * headDim, dim, gen, false));
}

Tensor GroupedQueryAttention::forward(const Tensor& x) {
  KOLO_REQUIRE(x.dim() == 3, "GroupedQueryAttention: input ", shapeString(x.shape()), " is not (B, T, C)");
  // The head counts come from the projections' widths (a rank of a tensor-parallel split
  // holds some of the heads), checked by causalAttention.
  const Tensor q = (*q_)(x), k = (*k_)(x), v = (*v_)(x);  // (B, T, Hq*d), (B, T, Hkv*d) x2
  return (*o_)(causalAttention(q, k, v, headDim_, rotary_));  // (B, T, C)
}

LlamaBlock::LlamaBlock(const LlamaBlockConfig& config, Generator& gen) {
  KOLO_REQUIRE(config.dim > 0 && config.heads > 0 && config.dim % config.heads == 0, "LlamaBlock: width ",
               config.dim, " is not divisible by ", config.heads, " heads");
  const int64_t hidden = config.hidden > 0 ? config.hidden : swigluHidden(config.dim);
  attnNorm_ = registerModule("attn_norm", std::make_shared<RMSNorm>(config.dim, config.normEps));
  attn_ = registerModule("attn", std::make_shared<GroupedQueryAttention>(
                                     config.dim, config.heads, config.kvHeads, config.dim / config.heads, gen,
                                     Rotary{.theta = config.ropeTheta}));
  mlpNorm_ = registerModule("mlp_norm", std::make_shared<RMSNorm>(config.dim, config.normEps));
  mlp_ = registerModule("mlp", std::make_shared<SwiGLU>(config.dim, hidden, gen));
}

Tensor LlamaBlock::forward(const Tensor& x) {
  const Tensor h = x + (*attn_)((*attnNorm_)(x));
  return h + (*mlp_)((*mlpNorm_)(h));
}

}  // namespace kolo::nn
