// Batch normalisation and average pooling kernels. An (N, C, ...) input is N x C planes of S
// contiguous values; each plane's sums run in eight lanes of its dtype (so that they
// vectorise) and are added up in f64, and the elementwise passes are one multiply-add per
// value with per-channel coefficients.
#include "tensor/norm_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "tensor/dispatch.h"

namespace kolo::kernels {
namespace {

constexpr int kLanes = 8;
// Planes of at least this many values (an image's) get channelMoments' one pass over memory;
// smaller ones (BatchNorm1d's one value a plane) the two passes over the whole input.
constexpr int64_t kMinPlaneForOnePass = 16;

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

// Sums of (p[i] - shift) and of its square, in one pass (in f32 the eight lanes as two SSE
// vectors: GCC leaves the two lane arrays' scalar form unvectorised).
template <class T>
void laneDeviations(const T* p, int64_t n, T shift, double& sum, double& squares) {
  T accD[kLanes] = {}, accQ[kLanes] = {};
  int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m128 sh = _mm_set1_ps(shift);
    __m128 d0 = _mm_setzero_ps(), d1 = d0, q0 = d0, q1 = d0;
    for (; i + kLanes <= n; i += kLanes) {
      const __m128 a = _mm_sub_ps(_mm_loadu_ps(p + i), sh), b = _mm_sub_ps(_mm_loadu_ps(p + i + 4), sh);
      d0 = _mm_add_ps(d0, a);
      d1 = _mm_add_ps(d1, b);
      q0 = _mm_add_ps(q0, _mm_mul_ps(a, a));
      q1 = _mm_add_ps(q1, _mm_mul_ps(b, b));
    }
    _mm_storeu_ps(accD, d0);
    _mm_storeu_ps(accD + 4, d1);
    _mm_storeu_ps(accQ, q0);
    _mm_storeu_ps(accQ + 4, q1);
  }
#endif
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T d = p[i + j] - shift;
      accD[j] += d;
      accQ[j] += d * d;
    }
  double s = 0.0, q = 0.0;
  for (int j = 0; j < kLanes; ++j) {
    s += accD[j];
    q += accQ[j];
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - shift;
    s += d;
    q += d * d;
  }
  sum = s;
  squares = q;
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

// The row loops below get an AVX2 clone (picked at load time) on x86-64, whose baseline build
// has SSE only; without FMA in either, their values are the same.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KOLO_PLANE_LOOPS __attribute__((target_clones("avx2", "default")))
#else
#define KOLO_PLANE_LOOPS
#endif

// out[i] = max(a p[i] + b, 0); with a residual, max((a p[i] + b) + r[i], 0): the batch norm's
// output as affinePlane rounds it, then the addition, then the ReLU (NaN gives 0, as relu).
template <class T>
KOLO_PLANE_LOOPS void affineReluPlane(const T* __restrict p, T* __restrict out, int64_t n, T a, T b) {
  for (int64_t i = 0; i < n; ++i) {
    const T y = a * p[i] + b;
    out[i] = y > T(0) ? y : T(0);
  }
}
template <class T>
KOLO_PLANE_LOOPS void affineAddReluPlane(const T* __restrict p, const T* __restrict r, T* __restrict out, int64_t n,
                                         T a, T b) {
  for (int64_t i = 0; i < n; ++i) {
    const T y = a * p[i] + b;
    const T z = y + r[i];
    out[i] = z > T(0) ? z : T(0);
  }
}

// laneSum and laneDot of the gradient through a ReLU, v = g where out > 0 else 0, in one pass
// and in their order (the same sums as theirs over the masked gradient); v into gz when given.
// In f32 the eight lanes are two SSE vectors and the mask a compare: GCC leaves the select of
// the scalar form unvectorised.
template <class T, bool kWrite>
void maskedLaneSums(const T* __restrict g, const T* __restrict out, const T* __restrict x, int64_t n, T shift,
                    T* __restrict gz, double& sum, double& dot) {
  T accS[kLanes] = {}, accD[kLanes] = {};
  int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m128 zero = _mm_setzero_ps(), sh = _mm_set1_ps(shift);
    __m128 s0 = zero, s1 = zero, d0 = zero, d1 = zero;
    for (; i + kLanes <= n; i += kLanes) {
      const __m128 v0 = _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(out + i), zero), _mm_loadu_ps(g + i));
      const __m128 v1 = _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(out + i + 4), zero), _mm_loadu_ps(g + i + 4));
      if constexpr (kWrite) {
        _mm_storeu_ps(gz + i, v0);
        _mm_storeu_ps(gz + i + 4, v1);
      }
      s0 = _mm_add_ps(s0, v0);
      s1 = _mm_add_ps(s1, v1);
      d0 = _mm_add_ps(d0, _mm_mul_ps(v0, _mm_sub_ps(_mm_loadu_ps(x + i), sh)));
      d1 = _mm_add_ps(d1, _mm_mul_ps(v1, _mm_sub_ps(_mm_loadu_ps(x + i + 4), sh)));
    }
    _mm_storeu_ps(accS, s0);
    _mm_storeu_ps(accS + 4, s1);
    _mm_storeu_ps(accD, d0);
    _mm_storeu_ps(accD + 4, d1);
  }
#endif
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T v = out[i + j] > T(0) ? g[i + j] : T(0);
      if constexpr (kWrite) gz[i + j] = v;
      accS[j] += v;
      accD[j] += v * (x[i + j] - shift);
    }
  double s = 0.0, d = 0.0;
  for (int j = 0; j < kLanes; ++j) {
    s += accS[j];
    d += accD[j];
  }
  for (; i < n; ++i) {
    const T v = out[i] > T(0) ? g[i] : T(0);
    if constexpr (kWrite) gz[i] = v;
    s += v;
    d += static_cast<double>(v) * (static_cast<double>(x[i]) - shift);
  }
  sum = s;
  dot = d;
}

// dx[i] = a v + b x[i] + c with v the gradient through the ReLU (g where out > 0, else 0).
template <class T>
void maskedInputGradPlane(const T* __restrict g, const T* __restrict out, const T* __restrict x, T* __restrict dx,
                          int64_t n, T a, T b, T c) {
  int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m128 zero = _mm_setzero_ps(), va = _mm_set1_ps(a), vb = _mm_set1_ps(b), vc = _mm_set1_ps(c);
    for (; i + 4 <= n; i += 4) {
      const __m128 v = _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(out + i), zero), _mm_loadu_ps(g + i));
      _mm_storeu_ps(dx + i,
                    _mm_add_ps(_mm_add_ps(_mm_mul_ps(va, v), _mm_mul_ps(vb, _mm_loadu_ps(x + i))), vc));
    }
  }
#endif
  for (; i < n; ++i) {
    const T v = out[i] > T(0) ? g[i] : T(0);
    dx[i] = a * v + b * x[i] + c;
  }
}

// dx = kg g + kx x + k0: the statistics' terms of a channel's input gradient folded into
// coefficients (kx and k0 zero with the running statistics, count 0).
struct InputGradCoefficients {
  double kg, kx = 0.0, k0 = 0.0;
  InputGradCoefficients(double w, double invstd, double mean, double sumG, double sumGCentered, double count)
      : kg(w * invstd) {
    if (count > 0) {
      kx = -kg * invstd * invstd * sumGCentered / count;
      k0 = -kg * sumG / count - kx * mean;
    }
  }
};

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
    if (p.s < kMinPlaneForOnePass) {
      for (int64_t b = 0; b < p.n; ++b)
        for (int64_t ch = 0; ch < p.c; ++ch) m.sum[ch] += laneSum(px + (b * p.c + ch) * p.s, p.s);
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const T mean = static_cast<T>(m.sum[ch] / static_cast<double>(std::max<int64_t>(m.count, 1)));
        for (int64_t b = 0; b < p.n; ++b) m.m2[ch] += laneSquares(px + (b * p.c + ch) * p.s, p.s, mean);
      }
      return;
    }
    // One pass over memory: each plane's sum, then its deviations from its own mean (as
    // rounded to T) and their squares while the plane is in cache; the planes' moments are
    // combined per channel after. A plane of S values about its mean m, with r = sum (x - m)
    // and q = sum (x - m)^2, has the sum S m + r and sum (x - M)^2 = q + 2 (m - M) r +
    // S (m - M)^2 about the channel's mean M: no term that cancels.
    const auto planes = static_cast<size_t>(p.n * p.c);
    std::vector<double> planeMean(planes), planeDeviation(planes), planeSquares(planes);
    const auto size = static_cast<double>(p.s);
    for (int64_t b = 0; b < p.n; ++b)
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const auto k = static_cast<size_t>(b * p.c + ch);
        const T* plane = px + static_cast<int64_t>(k) * p.s;
        const T mean = static_cast<T>(laneSum(plane, p.s) / size);
        planeMean[k] = mean;
        laneDeviations(plane, p.s, mean, planeDeviation[k], planeSquares[k]);
        m.sum[ch] += size * planeMean[k] + planeDeviation[k];
      }
    for (int64_t ch = 0; ch < p.c; ++ch) {
      const double mean = m.sum[ch] / static_cast<double>(m.count);
      for (int64_t b = 0; b < p.n; ++b) {
        const auto k = static_cast<size_t>(b * p.c + ch);
        const double d = planeMean[k] - mean;
        m.m2[ch] += planeSquares[k] + 2.0 * d * planeDeviation[k] + size * d * d;
      }
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
      const InputGradCoefficients k(w[ch], invstd[ch], mean[ch], sumG[ch], sumGCentered[ch], count);
      const T a = static_cast<T>(k.kg), b = static_cast<T>(k.kx), c = static_cast<T>(k.k0);
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

Tensor batchNormReluApply(const Tensor& x0, const std::vector<double>& mean, const std::vector<double>& invstd,
                          const Tensor& weight, const Tensor& bias, const Tensor& residual0) {
  const Tensor x = x0.contiguous();
  const Tensor residual = residual0.defined() ? residual0.contiguous() : Tensor();
  const Planes p = planesOf(x, "batch norm");
  KOLO_CHECK(!residual.defined() || (residual.shape() == x.shape() && residual.dtype() == x.dtype()),
             "batch norm: residual ", shapeString(residual.shape()), " added to output ", shapeString(x.shape()));
  const std::vector<double> w = channelValues(weight, p.c, 1.0), b = channelValues(bias, p.c, 0.0);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), "batch norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    const T* pr = residual.defined() ? residual.data<T>() : nullptr;
    T* po = out.data<T>();
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const double scale = w[ch] * invstd[ch];
        const int64_t at = (n * p.c + ch) * p.s;
        const T a = static_cast<T>(scale), c = static_cast<T>(b[ch] - mean[ch] * scale);
        if (pr)
          affineAddReluPlane(px + at, pr + at, po + at, p.s, a, c);
        else
          affineReluPlane(px + at, po + at, p.s, a, c);
      }
  });
  return out;
}

void batchNormReluGradSums(const Tensor& g0, const Tensor& out0, const Tensor& x0, const std::vector<double>& mean,
                           std::vector<double>& sumG, std::vector<double>& sumGCentered, Tensor* gradZ) {
  const Tensor g = g0.contiguous(), out = out0.contiguous(), x = x0.contiguous();
  const Planes p = planesOf(x, "batch norm backward");
  KOLO_CHECK(g.shape() == x.shape() && out.shape() == x.shape(), "batch norm backward: gradient ",
             shapeString(g.shape()), " and output ", shapeString(out.shape()), " for input ", shapeString(x.shape()));
  sumG.assign(static_cast<size_t>(p.c), 0.0);
  sumGCentered.assign(static_cast<size_t>(p.c), 0.0);
  if (gradZ) *gradZ = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), "batch norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    const T* po = out.data<T>();
    const T* px = x.data<T>();
    T* pz = gradZ ? gradZ->data<T>() : nullptr;
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const int64_t at = (n * p.c + ch) * p.s;
        const T shift = static_cast<T>(mean[ch]);
        double s = 0.0, d = 0.0;
        if (pz)
          maskedLaneSums<T, true>(pg + at, po + at, px + at, p.s, shift, pz + at, s, d);
        else
          maskedLaneSums<T, false>(pg + at, po + at, px + at, p.s, shift, nullptr, s, d);
        sumG[ch] += s;
        sumGCentered[ch] += d;
      }
  });
}

Tensor batchNormReluInputGrad(const Tensor& g0, const Tensor& out0, const Tensor& x0, const std::vector<double>& mean,
                              const std::vector<double>& invstd, const Tensor& weight, const std::vector<double>& sumG,
                              const std::vector<double>& sumGCentered, double count) {
  const Tensor g = g0.contiguous(), out = out0.contiguous(), x = x0.contiguous();
  const Planes p = planesOf(x, "batch norm backward");
  const std::vector<double> w = channelValues(weight, p.c, 1.0);
  Tensor dx = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), "batch norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    const T* po = out.data<T>();
    const T* px = x.data<T>();
    T* pd = dx.data<T>();
    for (int64_t ch = 0; ch < p.c; ++ch) {
      const InputGradCoefficients k(w[ch], invstd[ch], mean[ch], sumG[ch], sumGCentered[ch], count);
      const T a = static_cast<T>(k.kg), b = static_cast<T>(k.kx), c = static_cast<T>(k.k0);
      for (int64_t n = 0; n < p.n; ++n) {
        const int64_t at = (n * p.c + ch) * p.s;
        maskedInputGradPlane(pg + at, po + at, px + at, pd + at, p.s, a, b, c);
      }
    }
  });
  return dx;
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
