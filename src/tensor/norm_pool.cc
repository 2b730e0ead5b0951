// Batch normalisation and average pooling kernels. An (N, C, ...) input is N x C planes of S
// contiguous values; each plane's sums run in eight lanes of its dtype (so that they
// vectorise) and are added up in f64, and the elementwise passes are one multiply-add per
// value with per-channel coefficients.
#include "tensor/norm_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/dispatch.h"

namespace kolo::kernels {
namespace {

constexpr int kLanes = 8;

// (N, C, S): the batch, the channels and the values per plane of an input of two or more
// dimensions.
struct Planes {
  int64_t n = 0, c = 0, s = 0;
};

Planes planesOf(const Tensor& x, const char* op) {
  KOLO_CHECK(x.dim() >= 2, op, ": input must be (N, C, ...), got ", shapeString(x.shape()));
  Planes p{x.shape()[0], x.shape()[1], 1};
  for (int64_t d = 2; d < x.dim(); ++d) p.s *= x.shape()[d];
  return p;
}

template <class T>
double laneSum(const T* p, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += p[i + j];
  double total = 0.0;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; i < n; ++i) total += p[i];
  return total;
}

// Sum of (p[i] - shift)^2.
template <class T>
double laneSquares(const T* p, int64_t n, T shift) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T d = p[i + j] - shift;
      acc[j] += d * d;
    }
  double total = 0.0;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - shift;
    total += d * d;
  }
  return total;
}

// Sum of g[i] (x[i] - shift).
template <class T>
double laneDot(const T* g, const T* x, int64_t n, T shift) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += g[i + j] * (x[i + j] - shift);
  double total = 0.0;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; i < n; ++i) total += static_cast<double>(g[i]) * (static_cast<double>(x[i]) - shift);
  return total;
}

// Per-channel weight (1 when undefined) as f64.
std::vector<double> channelValues(const Tensor& t, int64_t c, double fallback) {
  if (!t.defined()) return std::vector<double>(static_cast<size_t>(c), fallback);
  KOLO_CHECK(t.numel() == c, "batch norm: per-channel tensor ", shapeString(t.shape()), " for ", c, " channels");
  return t.toDoubleVector();
}

// out[i] = a * p[i] + b over a plane.
template <class T>
void affinePlane(const T* p, T* out, int64_t n, T a, T b) {
  for (int64_t i = 0; i < n; ++i) out[i] = a * p[i] + b;
}

void checkPool(const Tensor& x, int64_t k, int64_t s, int64_t pad, const char* op) {
  KOLO_CHECK(x.dim() == 4, op, ": input must be (N, C, H, W), got ", shapeString(x.shape()));
  KOLO_CHECK(k > 0 && s > 0 && pad >= 0 && 2 * pad <= k, op, ": kernel ", k, ", stride ", s, ", padding ", pad);
  KOLO_CHECK(x.shape()[2] + 2 * pad >= k && x.shape()[3] + 2 * pad >= k, op, ": kernel ", k, " larger than input ",
             shapeString(x.shape()));
}

// PyTorch's adaptive bins: [floor(i n / out), ceil((i + 1) n / out)).
int64_t binStart(int64_t i, int64_t n, int64_t out) { return i * n / out; }
int64_t binEnd(int64_t i, int64_t n, int64_t out) { return ((i + 1) * n + out - 1) / out; }

}  // namespace

ChannelMoments channelMoments(const Tensor& x0) {
  const Tensor x = x0.contiguous();
  const Planes p = planesOf(x, "batch norm");
  ChannelMoments m;
  m.count = p.n * p.s;
  m.sum.assign(static_cast<size_t>(p.c), 0.0);
  m.m2.assign(static_cast<size_t>(p.c), 0.0);
  detail::dispatchFloat(x.dtype(), "batch norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    for (int64_t b = 0; b < p.n; ++b)
      for (int64_t ch = 0; ch < p.c; ++ch) m.sum[ch] += laneSum(px + (b * p.c + ch) * p.s, p.s);
    for (int64_t ch = 0; ch < p.c; ++ch) {
      const T mean = static_cast<T>(m.sum[ch] / static_cast<double>(std::max<int64_t>(m.count, 1)));
      for (int64_t b = 0; b < p.n; ++b) m.m2[ch] += laneSquares(px + (b * p.c + ch) * p.s, p.s, mean);
    }
  });
  return m;
}

Tensor batchNormApply(const Tensor& x0, const std::vector<double>& mean, const std::vector<double>& invstd,
                      const Tensor& weight, const Tensor& bias) {
  const Tensor x = x0.contiguous();
  const Planes p = planesOf(x, "batch norm");
  const std::vector<double> w = channelValues(weight, p.c, 1.0), b = channelValues(bias, p.c, 0.0);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), "batch norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const double scale = w[ch] * invstd[ch];
        const int64_t at = (n * p.c + ch) * p.s;
        affinePlane(px + at, po + at, p.s, static_cast<T>(scale), static_cast<T>(b[ch] - mean[ch] * scale));
      }
  });
  return out;
}

void batchNormGradSums(const Tensor& g0, const Tensor& x0, const std::vector<double>& mean, std::vector<double>& sumG,
                       std::vector<double>& sumGCentered) {
  const Tensor g = g0.contiguous(), x = x0.contiguous();
  const Planes p = planesOf(x, "batch norm backward");
  KOLO_CHECK(g.shape() == x.shape(), "batch norm backward: gradient ", shapeString(g.shape()), " for input ",
             shapeString(x.shape()));
  sumG.assign(static_cast<size_t>(p.c), 0.0);
  sumGCentered.assign(static_cast<size_t>(p.c), 0.0);
  detail::dispatchFloat(x.dtype(), "batch norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const int64_t at = (n * p.c + ch) * p.s;
        sumG[ch] += laneSum(pg + at, p.s);
        sumGCentered[ch] += laneDot(pg + at, px + at, p.s, static_cast<T>(mean[ch]));
      }
  });
}

Tensor batchNormInputGrad(const Tensor& g0, const Tensor& x0, const std::vector<double>& mean,
                          const std::vector<double>& invstd, const Tensor& weight, const std::vector<double>& sumG,
                          const std::vector<double>& sumGCentered, double count) {
  const Tensor g = g0.contiguous(), x = x0.contiguous();
  const Planes p = planesOf(x, "batch norm backward");
  const std::vector<double> w = channelValues(weight, p.c, 1.0);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), "batch norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t ch = 0; ch < p.c; ++ch) {
      // dx = kg g + kx x + k0: the statistics' terms folded into per-channel coefficients.
      const double kg = w[ch] * invstd[ch];
      double kx = 0.0, k0 = 0.0;
      if (count > 0) {
        kx = -kg * invstd[ch] * invstd[ch] * sumGCentered[ch] / count;
        k0 = -kg * sumG[ch] / count - kx * mean[ch];
      }
      const T a = static_cast<T>(kg), b = static_cast<T>(kx), c = static_cast<T>(k0);
      for (int64_t n = 0; n < p.n; ++n) {
        const int64_t at = (n * p.c + ch) * p.s;
        const T* gp = pg + at;
        const T* xp = px + at;
        T* op = po + at;
        for (int64_t i = 0; i < p.s; ++i) op[i] = a * gp[i] + b * xp[i] + c;
      }
    }
  });
  return out;
}

Tensor avgPool2dForward(const Tensor& x0, int64_t k, int64_t s, int64_t pad) {
  checkPool(x0, k, s, pad, "avgPool2d");
  const Tensor x = x0.contiguous();
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  Tensor out = Tensor::empty({n, c, oh, ow}, x.dtype());
  detail::dispatchFloat(x.dtype(), "avgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T scale = static_cast<T>(1.0 / static_cast<double>(k * k));
    for (int64_t plane = 0; plane < n * c; ++plane) {
      const T* in = x.data<T>() + plane * h * w;
      T* o = out.data<T>() + plane * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t r0 = std::max<int64_t>(i * s - pad, 0), r1 = std::min(i * s - pad + k, h);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t c0 = std::max<int64_t>(j * s - pad, 0), c1 = std::min(j * s - pad + k, w);
          T total = 0;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t col = c0; col < c1; ++col) total += in[r * w + col];
          o[i * ow + j] = total * scale;
        }
      }
    }
  });
  return out;
}

Tensor avgPool2dBackward(const Tensor& grad0, const Shape& xShape, int64_t k, int64_t s, int64_t pad) {
  const Tensor grad = grad0.contiguous();
  const int64_t h = xShape[2], w = xShape[3], oh = grad.shape()[2], ow = grad.shape()[3];
  Tensor out = Tensor::zeros(xShape, grad.dtype());
  detail::dispatchFloat(grad.dtype(), "avgPool2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T scale = static_cast<T>(1.0 / static_cast<double>(k * k));
    for (int64_t plane = 0; plane < xShape[0] * xShape[1]; ++plane) {
      const T* g = grad.data<T>() + plane * oh * ow;
      T* dst = out.data<T>() + plane * h * w;
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t r0 = std::max<int64_t>(i * s - pad, 0), r1 = std::min(i * s - pad + k, h);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t c0 = std::max<int64_t>(j * s - pad, 0), c1 = std::min(j * s - pad + k, w);
          const T v = g[i * ow + j] * scale;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t col = c0; col < c1; ++col) dst[r * w + col] += v;
        }
      }
    }
  });
  return out;
}

Tensor adaptiveAvgPool2dForward(const Tensor& x0, int64_t oh, int64_t ow) {
  KOLO_CHECK(x0.dim() == 4, "adaptiveAvgPool2d: input must be (N, C, H, W), got ", shapeString(x0.shape()));
  KOLO_CHECK(oh > 0 && ow > 0, "adaptiveAvgPool2d: output ", oh, "x", ow, " must be positive");
  const Tensor x = x0.contiguous();
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  Tensor out = Tensor::empty({n, c, oh, ow}, x.dtype());
  detail::dispatchFloat(x.dtype(), "adaptiveAvgPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t plane = 0; plane < n * c; ++plane) {
      const T* in = x.data<T>() + plane * h * w;
      T* o = out.data<T>() + plane * oh * ow;
      if (oh == 1 && ow == 1) {  // the global average of a plane
        o[0] = static_cast<T>(laneSum(in, h * w) / static_cast<double>(h * w));
        continue;
      }
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t r0 = binStart(i, h, oh), r1 = binEnd(i, h, oh);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t c0 = binStart(j, w, ow), c1 = binEnd(j, w, ow);
          double total = 0.0;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t col = c0; col < c1; ++col) total += in[r * w + col];
          o[i * ow + j] = static_cast<T>(total / static_cast<double>((r1 - r0) * (c1 - c0)));
        }
      }
    }
  });
  return out;
}

Tensor adaptiveAvgPool2dBackward(const Tensor& grad0, const Shape& xShape) {
  const Tensor grad = grad0.contiguous();
  const int64_t h = xShape[2], w = xShape[3], oh = grad.shape()[2], ow = grad.shape()[3];
  Tensor out = Tensor::zeros(xShape, grad.dtype());
  detail::dispatchFloat(grad.dtype(), "adaptiveAvgPool2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t plane = 0; plane < xShape[0] * xShape[1]; ++plane) {
      const T* g = grad.data<T>() + plane * oh * ow;
      T* dst = out.data<T>() + plane * h * w;
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t r0 = binStart(i, h, oh), r1 = binEnd(i, h, oh);
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t c0 = binStart(j, w, ow), c1 = binEnd(j, w, ow);
          const T v = static_cast<T>(g[i * ow + j] / static_cast<double>((r1 - r0) * (c1 - c0)));
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t col = c0; col < c1; ++col) dst[r * w + col] += v;
        }
      }
    }
  });
  return out;
}

}  // namespace kolo::kernels
