// Differentiable ops of LLaMA-style blocks: RMSNorm, SiLU and the SwiGLU gate, rotary position
// embeddings, and causal attention over separate q, k, v projections with grouped key/value
// heads and the rotation inside the op.
#include "kolo/ops.h"
#include "tensor/kernels.h"

namespace kolo {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
bool req(const Tensor& t) { return t.defined() && t.requiresGrad(); }
}  // namespace

Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  KOLO_REQUIRE(x.dim() >= 1, "rmsNorm: input ", shapeString(x.shape()), " has no feature dimension");
  if (weight.defined())
    KOLO_REQUIRE(weight.shape() == Shape{x.shape().back()}, "rmsNorm: weight ", shapeString(weight.shape()),
                 " does not match the features of input ", shapeString(x.shape()));
  Tensor rstd;
  Tensor out = kernels::rmsNormForward(x, weight, eps, &rstd);
  if (!autograd::needsRecord({&x, &weight})) return out;
  Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor();
  const bool rx = req(x), rw = req(weight);
  return record(out, {x, weight}, "RMSNormBackward", [=](const Tensor& g) {
    Tensor gx, gw;
    kernels::rmsNormBackward(g, xd, wd, rstd, rx ? &gx : nullptr, rw ? &gw : nullptr);
    return Grads{gx, gw};
  });
}

Tensor silu(const Tensor& x) {
  Tensor out = kernels::swigluForward(x, Tensor());
  if (!autograd::needsRecord({&x})) return out;
  Tensor xd = x.detach();
  return record(out, {x}, "SiLUBackward", [xd](const Tensor& g) {
    Tensor gx;
    kernels::swigluBackward(g, xd, Tensor(), &gx, nullptr);
    return Grads{gx};
  });
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  KOLO_REQUIRE(gate.shape() == up.shape(), "swiglu: gate ", shapeString(gate.shape()), " and up ",
               shapeString(up.shape()), " differ in shape");
  Tensor out = kernels::swigluForward(gate, up);
  if (!autograd::needsRecord({&gate, &up})) return out;
  Tensor gd = gate.detach(), ud = up.detach();
  const bool ru = req(up);
  return record(out, {gate, up}, "SwiGLUBackward", [=](const Tensor& g) {
    Tensor gg, gu;
    kernels::swigluBackward(g, gd, ud, &gg, ru ? &gu : nullptr);
    return Grads{gg, gu};
  });
}

Tensor rotaryEmbedding(const Tensor& x, int64_t headDim, const Rotary& rotary) {
  Tensor out = kernels::rotaryForward(x, headDim, rotary.theta, rotary.offset, false);
  if (!autograd::needsRecord({&x})) return out;
  return record(out, {x}, "RotaryBackward", [headDim, rotary](const Tensor& g) {
    return Grads{kernels::rotaryForward(g, headDim, rotary.theta, rotary.offset, true)};
  });
}

Tensor causalAttention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t headDim,
                       std::optional<Rotary> rotary) {
  // The rotation goes into copies of q and k that the kernel reads and backward keeps instead
  // of q and k: the saved activations are those of attention without it.
  const Tensor qr = rotary ? kernels::rotaryForward(q, headDim, rotary->theta, rotary->offset, false) : q;
  const Tensor kr = rotary ? kernels::rotaryForward(k, headDim, rotary->theta, rotary->offset, false) : k;
  if (!autograd::needsRecord({&q, &k, &v})) return kernels::groupedAttentionForward(qr, kr, v, headDim, nullptr);
  // P (B, Hq, T, T) is kept while it is no larger than q, k and v together (Hq T <= (Hq +
  // 2 Hkv) d), as causalAttention(qkv, heads) keeps it; longer contexts recompute it.
  const int64_t hq = q.dim() == 3 && headDim > 0 ? q.shape()[2] / headDim : 0;
  const bool keep = q.dim() == 3 && k.dim() == 3 && hq * q.shape()[1] <= q.shape()[2] + 2 * k.shape()[2];
  Tensor logSumExp, probabilities;
  Tensor out = kernels::groupedAttentionForward(qr, kr, v, headDim, &logSumExp, keep ? &probabilities : nullptr);
  Tensor qd = qr.detach(), kd = kr.detach(), vd = v.detach();
  return record(out, {q, k, v}, "CausalAttentionBackward",
                [qd, kd, vd, logSumExp, probabilities, headDim, rotary](const Tensor& g) {
                  Tensor gq, gk, gv;
                  kernels::groupedAttentionBackward(g, qd, kd, vd, headDim, logSumExp, probabilities, &gq, &gk, &gv);
                  if (rotary) {
                    gq = kernels::rotaryForward(gq, headDim, rotary->theta, rotary->offset, true);
                    gk = kernels::rotaryForward(gk, headDim, rotary->theta, rotary->offset, true);
                  }
                  return Grads{gq, gk, gv};
                });
}

}  // namespace kolo
