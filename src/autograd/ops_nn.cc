// Differentiable neural-network functions (softmax, cross-entropy, convolution, pooling,
// layer norm, embedding, dropout) and joining/selection ops (cat, stack, where).
#include "kolo/ops.h"
#include "tensor/kernels.h"

namespace kolo {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
bool req(const Tensor& t) { return t.defined() && t.requiresGrad(); }

// A handle with t's shape and dtype but no storage: what a backward function keeps of an
// operand that only the gradient it does not compute would read. It holds no reference to
// t's memory (a read would fault rather than see stale values).
Tensor shapeOnly(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();
  impl->shape = t.shape();
  impl->strides = contiguousStrides(t.shape());
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = kernels::softmax(x, dim);
  if (!autograd::needsRecord({&x})) return out;
  Tensor y = out.detach();
  return record(out, {x}, "SoftmaxBackward",
                [y, dim](const Tensor& g) { return Grads{kernels::softmaxBackward(g, y, dim)}; });
}

Tensor logSoftmax(const Tensor& x, int64_t dim) {
  Tensor out = kernels::logSoftmax(x, dim);
  if (!autograd::needsRecord({&x})) return out;
  Tensor y = out.detach();
  return record(out, {x}, "LogSoftmaxBackward",
                [y, dim](const Tensor& g) { return Grads{kernels::logSoftmaxBackward(g, y, dim)}; });
}

Tensor crossEntropy(const Tensor& logits, const Tensor& labels) {
  const Shape& shape = logits.shape();
  // Scores of a sequence, (..., C) against labels (...): every position is a sample.
  if (logits.dim() > 2 && labels.shape() == Shape(shape.begin(), shape.end() - 1))
    return crossEntropy(logits.reshape({-1, shape.back()}), labels.reshape({-1}));
  KOLO_REQUIRE(logits.dim() == 2 && labels.dim() == 1 && labels.shape()[0] == shape[0], "crossEntropy: logits ",
               shapeString(shape), " and labels ", shapeString(labels.shape()),
               " do not match (logits [N, C] with labels [N], or [..., C] with labels [...])");
  Tensor probs;
  Tensor out = kernels::crossEntropyForward(logits, labels, &probs);
  Tensor lab = labels.detach();
  return record(out, {logits}, "CrossEntropyBackward", [probs, lab](const Tensor& g) {
    return Grads{kernels::crossEntropyBackward(probs, lab, g.item())};
  });
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding) {
  KOLO_CHECK(stride > 0 && padding >= 0, "conv2d: stride ", stride, ", padding ", padding);
  kernels::Conv2dParams p{stride, stride, padding, padding};
  Tensor out = kernels::conv2dForward(x, weight, bias, p);
  if (!autograd::needsRecord({&x, &weight, &bias})) return out;
  bool rx = req(x), rw = req(weight), rb = req(bias);
  // The input is read only for the weight's gradient and the weight only for the input's
  // (as in linear): a first layer, whose input needs no gradient, keeps no reference to
  // its weight.
  Tensor xd = rw ? x.detach() : shapeOnly(x), wd = rx ? weight.detach() : shapeOnly(weight);
  return record(out, {x, weight, bias}, "Conv2dBackward", [=](const Tensor& g) {
    Tensor gx, gw, gb;
    kernels::conv2dBackward(g, xd, wd, p, rx ? &gx : nullptr, rw ? &gw : nullptr, rb ? &gb : nullptr);
    return Grads{gx, gw, gb};
  });
}

Tensor maxPool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  if (stride <= 0) stride = kernel;
  Tensor indices;
  Tensor out = kernels::maxPool2dForward(x, kernel, stride, padding, &indices);
  Shape shape = x.shape();
  return record(out, {x}, "MaxPool2dBackward", [indices, shape](const Tensor& g) {
    return Grads{kernels::maxPool2dBackward(g, indices, shape)};
  });
}

Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight, const Tensor& bias,
                 double eps) {
  const int64_t k = static_cast<int64_t>(normalizedShape.size());
  KOLO_CHECK(k >= 1 && x.dim() >= k &&
                 Shape(x.shape().end() - k, x.shape().end()) == normalizedShape,
             "layerNorm: input ", shapeString(x.shape()), " does not end with normalized shape ",
             shapeString(normalizedShape));
  if (weight.defined())
    KOLO_CHECK(weight.shape() == normalizedShape, "layerNorm: weight ", shapeString(weight.shape()),
               " vs normalized shape ", shapeString(normalizedShape));
  const int64_t normSize = shapeNumel(normalizedShape);
  Tensor mean, rstd;
  Tensor out = kernels::layerNormForward(x, weight, bias, normSize, eps, &mean, &rstd);
  if (!autograd::needsRecord({&x, &weight, &bias})) return out;
  Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor();
  bool rx = req(x), rw = req(weight), rb = req(bias);
  return record(out, {x, weight, bias}, "LayerNormBackward", [=](const Tensor& g) {
    Tensor gx, gw, gb;
    kernels::layerNormBackward(g, xd, wd, mean, rstd, normSize, rx ? &gx : nullptr, rw ? &gw : nullptr,
                               rb ? &gb : nullptr);
    if (gw.defined()) gw = kernels::reshapeRaw(gw, normalizedShape);
    if (gb.defined()) gb = kernels::reshapeRaw(gb, normalizedShape);
    return Grads{gx, gw, gb};
  });
}

Tensor causalAttention(const Tensor& qkv, int64_t heads) {
  if (!autograd::needsRecord({&qkv})) return kernels::causalAttentionForward(qkv, heads, nullptr);
  // Backward reads P (B, H, T, T) when the forward keeps it, and otherwise recomputes it from
  // the row log-sum-exp (a product and an exponential per score more). P is kept while it is
  // no larger than qkv (B, T, 3C), i.e. H T <= 3C: the saved activations at most double,
  // and long contexts, where P would grow with T^2, recompute it.
  const bool keep = qkv.dim() == 3 && heads * qkv.shape()[1] <= qkv.shape()[2];
  Tensor logSumExp, probabilities;
  Tensor out = kernels::causalAttentionForward(qkv, heads, &logSumExp, keep ? &probabilities : nullptr);
  // With the log-sum-exp (and P), qkv is all backward needs.
  Tensor qd = qkv.detach();
  return record(out, {qkv}, "CausalAttentionBackward", [qd, logSumExp, probabilities, heads](const Tensor& g) {
    return Grads{kernels::causalAttentionBackward(g, qd, logSumExp, heads, probabilities)};
  });
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  Tensor out = kernels::embeddingForward(indices, weight);
  Tensor idx = indices.detach();
  const int64_t v = weight.shape()[0];
  return record(out, {weight}, "EmbeddingBackward",
                [idx, v](const Tensor& g) { return Grads{kernels::embeddingBackward(g, idx, v)}; });
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  KOLO_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability ", p, " outside [0, 1]");
  if (!training || p == 0.0) return x;
  Tensor mask = Tensor::empty(x.shape(), x.dtype());
  const double scale = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
  std::vector<double> m(static_cast<size_t>(x.numel()));
  for (auto& v : m) v = gen.uniform() >= p ? scale : 0.0;
  mask.copyFrom(Tensor::fromVector(x.shape(), m));
  return mul(x, mask);
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor out = kernels::cat(xs, dim);
  if (!autograd::needsRecord(xs)) return out;
  std::vector<int64_t> sizes;
  std::vector<bool> needs;
  for (const Tensor& x : xs) {
    sizes.push_back(x.shape()[kernels::wrapDim(dim, x.dim(), "cat")]);
    needs.push_back(req(x));
  }
  return record(out, xs, "CatBackward", [=](const Tensor& g) {
    Grads grads;
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads.push_back(needs[i] ? kernels::sliceRaw(g, dim, at, at + sizes[i], 1).contiguous() : Tensor());
      at += sizes[i];
    }
    return grads;
  });
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  KOLO_CHECK(!xs.empty(), "stack of no tensors");
  std::vector<Tensor> expanded;
  expanded.reserve(xs.size());
  for (const Tensor& x : xs) expanded.push_back(x.unsqueeze(dim));
  return cat(expanded, dim);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::where(cond, a, b);
  if (!autograd::needsRecord({&a, &b})) return out;
  Tensor c = cond.detach();
  Shape sa = a.shape(), sb = b.shape();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, "WhereBackward", [=](const Tensor& g) {
    Tensor zero = Tensor::scalar(0.0, g.dtype());
    return Grads{ra ? kernels::sumToShape(kernels::where(c, g, zero), sa) : Tensor(),
                 rb ? kernels::sumToShape(kernels::where(c, zero, g), sb) : Tensor()};
  });
}

Tensor maskedFill(const Tensor& x, const Tensor& mask, double value) {
  return where(mask, Tensor::scalar(value, x.dtype()), x);
}

Tensor trilMask(int64_t n) {
  Tensor m = Tensor::zeros({n, n}, DType::U8);
  uint8_t* p = m.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) p[i * n + j] = 1;
  return m;
}

}  // namespace kolo
