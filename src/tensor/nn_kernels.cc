// Fused kernels used by the nn layer: softmax / log-softmax and their gradients, mean
// cross-entropy over class logits, layer normalisation, embedding lookup, concatenation.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"
#include "tensor/label_error.h"
#include "tensor/row_kernels.h"

namespace kolo::kernels {

namespace {

struct Lanes {
  int64_t outer = 1, n = 1, inner = 1;
};

Lanes lanes(const Shape& shape, int64_t dim) {
  Lanes l;
  for (int64_t i = 0; i < dim; ++i) l.outer *= shape[i];
  l.n = shape[dim];
  for (size_t i = dim + 1; i < shape.size(); ++i) l.inner *= shape[i];
  return l;
}

// Softmax (log=false) or log-softmax (log=true) of each lane along `dim`.
Tensor softmaxImpl(const Tensor& x0, int64_t dim, bool log) {
  Tensor x = x0.contiguous();
  dim = wrapDim(dim, std::max<int64_t>(x.dim(), 1), "softmax");
  const Lanes l = x.dim() == 0 ? Lanes{} : lanes(x.shape(), dim);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  if (x.dtype() == DType::F32 && l.inner == 1) {
    detail::softmaxRows(x.data<float>(), out.data<float>(), l.outer, l.n, log);
    return out;
  }
  detail::dispatchFloat(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t i = 0; i < l.inner; ++i) {
        const T* in = px + o * l.n * l.inner + i;
        T* dst = po + o * l.n * l.inner + i;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t k = 0; k < l.n; ++k) mx = std::max(mx, in[k * l.inner]);
        T total = T(0);
        for (int64_t k = 0; k < l.n; ++k) {
          const T e = std::exp(in[k * l.inner] - mx);
          total += e;
          if (!log) dst[k * l.inner] = e;
        }
        if (log) {
          const T lse = mx + std::log(total);
          for (int64_t k = 0; k < l.n; ++k) dst[k * l.inner] = in[k * l.inner] - lse;
        } else {
          const T inv = T(1) / total;
          for (int64_t k = 0; k < l.n; ++k) dst[k * l.inner] *= inv;
        }
      }
  });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmaxImpl(x, dim, false); }
Tensor logSoftmax(const Tensor& x, int64_t dim) { return softmaxImpl(x, dim, true); }

namespace {

// softmax:    dx = y * (g - sum(g * y))
// logSoftmax: dx = g - exp(y) * sum(g)
Tensor softmaxBackwardImpl(const Tensor& grad0, const Tensor& y, int64_t dim, bool logSpace) {
  const char* what = logSpace ? "logSoftmax backward" : "softmax backward";
  Tensor grad = grad0.contiguous();
  dim = wrapDim(dim, y.dim(), what);
  const Lanes l = lanes(y.shape(), dim);
  Tensor out = Tensor::empty(y.shape(), y.dtype());
  detail::dispatchFloat(y.dtype(), what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = grad.data<T>();
    const T* py = y.data<T>();
    T* po = out.data<T>();
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t base = o * l.n * l.inner + i;
        T acc = T(0);
        for (int64_t k = 0; k < l.n; ++k)
          acc += logSpace ? pg[base + k * l.inner] : pg[base + k * l.inner] * py[base + k * l.inner];
        for (int64_t k = 0; k < l.n; ++k) {
          const int64_t at = base + k * l.inner;
          po[at] = logSpace ? pg[at] - std::exp(py[at]) * acc : py[at] * (pg[at] - acc);
        }
      }
  });
  return out;
}

}  // namespace

Tensor softmaxBackward(const Tensor& grad0, const Tensor& y, int64_t dim) {
  return softmaxBackwardImpl(grad0, y, dim, false);
}

Tensor logSoftmaxBackward(const Tensor& grad0, const Tensor& y, int64_t dim) {
  return softmaxBackwardImpl(grad0, y, dim, true);
}

namespace {
int64_t labelAt(const Tensor& labels, int64_t i) {
  if (labels.dtype() == DType::I64) return labels.data<int64_t>()[i];
  if (labels.dtype() == DType::I32) return labels.data<int32_t>()[i];
  KOLO_THROW(InvalidArgument, "crossEntropy: labels must be i64 or i32, got ", dtypeName(labels.dtype()));
}
}  // namespace

Tensor crossEntropyForward(const Tensor& logits, const Tensor& labels0, Tensor* probs) {
  KOLO_CHECK(logits.dim() == 2, "crossEntropy: logits must be [N, C], got ", shapeString(logits.shape()));
  KOLO_CHECK(labels0.dim() == 1 && labels0.shape()[0] == logits.shape()[0], "crossEntropy: labels ",
             shapeString(labels0.shape()), " do not match logits ", shapeString(logits.shape()));
  Tensor labels = labels0.contiguous();
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  Tensor p = softmaxImpl(logits, 1, true);  // log-probabilities first
  double loss = 0.0;
  detail::dispatchFloat(p.dtype(), "crossEntropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pp = p.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t y = labelAt(labels, i);
      if (y < 0 || y >= c)
        throw ::kolo::detail::LabelOutOfRange(
            kolo::detail::concat("crossEntropy: label ", y, " at row ", i, " outside [0, ", c, ")"), y, c);
      loss -= pp[i * c + y];
    }
    if constexpr (std::is_same_v<T, float>) {
      detail::expInPlace(pp, n * c);
    } else {
      for (int64_t i = 0; i < n * c; ++i) pp[i] = std::exp(pp[i]);
    }
  });
  if (probs) *probs = p;
  return Tensor::scalar(n > 0 ? loss / static_cast<double>(n) : 0.0, logits.dtype());
}

Tensor crossEntropyBackward(const Tensor& probs, const Tensor& labels0, double gradScale) {
  Tensor labels = labels0.contiguous();
  const int64_t n = probs.shape()[0], c = probs.shape()[1];
  Tensor out = Tensor::empty(probs.shape(), probs.dtype());
  detail::dispatchFloat(probs.dtype(), "crossEntropy backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(gradScale / static_cast<double>(n));
    const T* pp = probs.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < n * c; ++i) po[i] = pp[i] * s;
    for (int64_t i = 0; i < n; ++i) po[i * c + labelAt(labels, i)] -= s;
  });
  return out;
}

Tensor layerNormForward(const Tensor& x0, const Tensor& weight, const Tensor& bias, int64_t normSize,
                        double eps, Tensor* mean, Tensor* rstd) {
  Tensor x = x0.contiguous();
  KOLO_CHECK(normSize > 0 && x.numel() % normSize == 0, "layerNorm: normalized size ", normSize,
             " does not divide input ", shapeString(x.shape()));
  const int64_t rows = x.numel() / normSize;
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor m = Tensor::empty({rows}, x.dtype()), r = Tensor::empty({rows}, x.dtype());
  if (x.dtype() == DType::F32) {
    Tensor wc = weight.defined() ? weight.contiguous() : Tensor(), bc = bias.defined() ? bias.contiguous() : Tensor();
    detail::layerNormRows(x.data<float>(), wc.defined() ? wc.data<float>() : nullptr,
                          bc.defined() ? bc.data<float>() : nullptr, out.data<float>(), m.data<float>(),
                          r.data<float>(), rows, normSize, static_cast<float>(eps));
    if (mean) *mean = m;
    if (rstd) *rstd = r;
    return out;
  }
  detail::dispatchFloat(x.dtype(), "layerNorm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    const T* pw = weight.defined() ? weight.contiguous().data<T>() : nullptr;
    const T* pb = bias.defined() ? bias.contiguous().data<T>() : nullptr;
    T* po = out.data<T>();
    for (int64_t row = 0; row < rows; ++row) {
      const T* in = px + row * normSize;
      double mu = 0.0;
      for (int64_t i = 0; i < normSize; ++i) mu += in[i];
      mu /= normSize;
      double var = 0.0;
      for (int64_t i = 0; i < normSize; ++i) var += (in[i] - mu) * (in[i] - mu);
      var /= normSize;
      const double rs = 1.0 / std::sqrt(var + eps);
      m.data<T>()[row] = static_cast<T>(mu);
      r.data<T>()[row] = static_cast<T>(rs);
      T* dst = po + row * normSize;
      for (int64_t i = 0; i < normSize; ++i) {
        T v = static_cast<T>((in[i] - mu) * rs);
        if (pw) v *= pw[i];
        if (pb) v += pb[i];
        dst[i] = v;
      }
    }
  });
  if (mean) *mean = m;
  if (rstd) *rstd = r;
  return out;
}

void layerNormBackward(const Tensor& grad0, const Tensor& x0, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, int64_t normSize, Tensor* gradX, Tensor* gradW, Tensor* gradB) {
  Tensor x = x0.contiguous(), grad = grad0.contiguous();
  const int64_t rows = x.numel() / normSize;
  if (gradX) *gradX = Tensor::empty(x.shape(), x.dtype());
  if (gradW) *gradW = Tensor::zeros({normSize}, x.dtype());
  if (gradB) *gradB = Tensor::zeros({normSize}, x.dtype());
  if (x.dtype() == DType::F32) {
    Tensor wc = weight.defined() ? weight.contiguous() : Tensor();
    detail::layerNormBackwardRows(grad.data<float>(), x.data<float>(), wc.defined() ? wc.data<float>() : nullptr,
                                  mean.data<float>(), rstd.data<float>(), rows, normSize,
                                  gradX ? gradX->data<float>() : nullptr, gradW ? gradW->data<float>() : nullptr,
                                  gradB ? gradB->data<float>() : nullptr);
    return;
  }
  detail::dispatchFloat(x.dtype(), "layerNorm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor wc = weight.defined() ? weight.contiguous() : Tensor();
    const T* pw = wc.defined() ? wc.data<T>() : nullptr;
    const T* px = x.data<T>();
    const T* pg = grad.data<T>();
    const T* pm = mean.data<T>();
    const T* pr = rstd.data<T>();
    for (int64_t row = 0; row < rows; ++row) {
      const T* in = px + row * normSize;
      const T* g = pg + row * normSize;
      const double mu = pm[row], rs = pr[row];
      double sumDy = 0.0, sumDyXhat = 0.0;
      for (int64_t i = 0; i < normSize; ++i) {
        const double xhat = (in[i] - mu) * rs;
        const double dy = g[i] * (pw ? pw[i] : T(1));
        sumDy += dy;
        sumDyXhat += dy * xhat;
        if (gradW) gradW->data<T>()[i] += static_cast<T>(g[i] * xhat);
        if (gradB) gradB->data<T>()[i] += g[i];
      }
      if (gradX) {
        T* dx = gradX->data<T>() + row * normSize;
        for (int64_t i = 0; i < normSize; ++i) {
          const double xhat = (in[i] - mu) * rs;
          const double dy = g[i] * (pw ? pw[i] : T(1));
          dx[i] = static_cast<T>(rs * (dy - sumDy / normSize - xhat * sumDyXhat / normSize));
        }
      }
    }
  });
}

Tensor biasGeluForward(Tensor& pre, const Tensor& bias0) {
  KOLO_CHECK(pre.dtype() == DType::F32 && pre.dim() == 2 && pre.isContiguous() && bias0.dtype() == DType::F32 &&
                 bias0.dim() == 1 && bias0.shape()[0] == pre.shape()[1],
             "biasGelu: pre-activation ", shapeString(pre.shape()), " and bias ", shapeString(bias0.shape()),
             " are not contiguous f32 (M, N) and (N)");
  Tensor bias = bias0.contiguous();
  Tensor out = Tensor::empty(pre.shape(), DType::F32);
  detail::biasGeluRows(pre.data<float>(), bias.data<float>(), out.data<float>(), pre.shape()[0], pre.shape()[1]);
  return out;
}

Tensor biasGeluBackward(const Tensor& grad0, const Tensor& pre, Tensor* gradBias) {
  Tensor grad = grad0.contiguous();
  KOLO_CHECK(grad.shape() == pre.shape() && grad.dtype() == DType::F32, "biasGelu backward: gradient ",
             shapeString(grad.shape()), " does not match ", shapeString(pre.shape()));
  const int64_t n = pre.shape()[1];
  Tensor out = Tensor::empty(pre.shape(), DType::F32);
  Tensor gb = Tensor::zeros({n}, DType::F32);
  detail::geluBackwardBiasRows(grad.data<float>(), pre.data<float>(), out.data<float>(), gb.data<float>(),
                               pre.shape()[0], n);
  if (gradBias) *gradBias = gb;
  return out;
}

Tensor embeddingForward(const Tensor& indices0, const Tensor& weight) {
  KOLO_CHECK(weight.dim() == 2, "embedding: weight must be [V, D], got ", shapeString(weight.shape()));
  Tensor indices = indices0.contiguous(), w = weight.contiguous();
  const int64_t v = w.shape()[0], d = w.shape()[1], n = indices.numel();
  Shape shape = indices.shape();
  shape.push_back(d);
  Tensor out = Tensor::empty(shape, w.dtype());
  const size_t rowBytes = static_cast<size_t>(d) * dtypeSize(w.dtype());
  const auto* src = static_cast<const uint8_t*>(w.rawData());
  auto* dst = static_cast<uint8_t*>(out.rawData());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = labelAt(indices, i);
    if (id < 0 || id >= v) KOLO_THROW(InvalidArgument, "embedding: index ", id, " outside [0, ", v, ")");
    std::memcpy(dst + i * rowBytes, src + id * rowBytes, rowBytes);
  }
  return out;
}

Tensor embeddingBackward(const Tensor& grad0, const Tensor& indices0, int64_t numEmbeddings) {
  Tensor grad = grad0.contiguous(), indices = indices0.contiguous();
  const int64_t d = grad.shape().back(), n = indices.numel();
  Tensor out = Tensor::zeros({numEmbeddings, d}, grad.dtype());
  detail::dispatchFloat(grad.dtype(), "embedding backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = grad.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      T* row = po + labelAt(indices, i) * d;
      for (int64_t j = 0; j < d; ++j) row[j] += pg[i * d + j];
    }
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  KOLO_CHECK(!xs.empty(), "cat of no tensors");
  const int64_t nd = xs[0].dim();
  dim = wrapDim(dim, nd, "cat");
  Shape shape = xs[0].shape();
  int64_t total = 0;
  for (const Tensor& x : xs) {
    KOLO_CHECK(x.dim() == nd && x.dtype() == xs[0].dtype(), "cat: ", shapeString(x.shape()), " ",
               dtypeName(x.dtype()), " vs ", shapeString(shape), " ", dtypeName(xs[0].dtype()));
    for (int64_t i = 0; i < nd; ++i)
      if (i != dim)
        KOLO_CHECK(x.shape()[i] == shape[i], "cat along ", dim, ": shapes ", shapeString(x.shape()), " and ",
                   shapeString(shape), " differ in dimension ", i);
    total += x.shape()[dim];
  }
  shape[dim] = total;
  Tensor out = Tensor::empty(shape, xs[0].dtype());
  int64_t at = 0;
  for (const Tensor& x : xs) {
    Tensor region = sliceRaw(out, dim, at, at + x.shape()[dim], 1);
    copyInto(region, x);
    at += x.shape()[dim];
  }
  return out;
}

}  // namespace kolo::kernels
