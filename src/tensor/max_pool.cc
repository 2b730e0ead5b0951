// Max pooling over NCHW planes (forward with the winners' indices, backward scattering the
// gradient to them): branch-free windows, a 2x2 stride-2 form and a padded one.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"
#include "tensor/row_loops.h"

namespace kolo::kernels {

namespace {

// One [h, w] plane without padding, window K (compile-time when K > 0, else k) and stride s.
// Branch-free selects: which element of a window wins is data-dependent and unpredictable.
// NaN wins and propagates (as in PyTorch); ties keep the first index.
template <class T, int K>
void poolPlaneNoPad(const T* in, int64_t w, int64_t k0, int64_t s, int64_t oh, int64_t ow, T* out, int32_t* idx) {
  const int64_t k = K > 0 ? K : k0;
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t xx = 0; xx < ow; ++xx) {
      const int64_t base = y * s * w + xx * s;
      T best = in[base];
      int32_t arg = static_cast<int32_t>(base);
      for (int64_t ki = 0; ki < k; ++ki)
        for (int64_t kj = 0; kj < k; ++kj) {
          const int64_t at = base + ki * w + kj;
          const T v = in[at];
          const bool take = (v > best) | (v != v);
          best = take ? v : best;
          arg = take ? static_cast<int32_t>(at) : arg;
        }
      out[y * ow + xx] = best;
      idx[y * ow + xx] = arg;
    }
}

// The common 2x2 window with stride 2 and no padding, vectorisable over output columns.
template <class T>
KOLO_ROW_LOOPS void poolPlane2x2(const T* __restrict in, int64_t w, int64_t oh, int64_t ow, T* __restrict out,
                                 int32_t* __restrict idx) {
  for (int64_t y = 0; y < oh; ++y) {
    const T* r0 = in + 2 * y * w;
    const T* r1 = r0 + w;
    T* o = out + y * ow;
    int32_t* oi = idx + y * ow;
    const int32_t rowBase = static_cast<int32_t>(2 * y * w);
    const int32_t below = static_cast<int32_t>(w);
    for (int64_t x = 0; x < ow; ++x) {
      const int32_t at = rowBase + static_cast<int32_t>(2 * x);
      T best = r0[2 * x];
      int32_t arg = at;
      T v = r0[2 * x + 1];
      bool take = (v > best) | (v != v);
      best = take ? v : best;
      arg = take ? at + 1 : arg;
      v = r1[2 * x];
      take = (v > best) | (v != v);
      best = take ? v : best;
      arg = take ? at + below : arg;
      v = r1[2 * x + 1];
      take = (v > best) | (v != v);
      best = take ? v : best;
      arg = take ? at + below + 1 : arg;
      o[x] = best;
      oi[x] = arg;
    }
  }
}

// One plane with padding: windows are clipped to the image.
template <class T>
void poolPlanePadded(const T* in, int64_t h, int64_t w, int64_t k, int64_t s, int64_t pad, int64_t oh, int64_t ow,
                     T* out, int32_t* idx) {
  for (int64_t y = 0; y < oh; ++y) {
    const int64_t y0 = std::max<int64_t>(y * s - pad, 0), y1 = std::min(y * s - pad + k, h);
    for (int64_t xx = 0; xx < ow; ++xx) {
      const int64_t x0 = std::max<int64_t>(xx * s - pad, 0), x1 = std::min(xx * s - pad + k, w);
      T best = -std::numeric_limits<T>::infinity();
      int32_t arg = static_cast<int32_t>(y0 * w + x0);
      for (int64_t iy = y0; iy < y1; ++iy)
        for (int64_t ix = x0; ix < x1; ++ix) {
          const T v = in[iy * w + ix];
          const bool take = (v > best) | (v != v);
          best = take ? v : best;
          arg = take ? static_cast<int32_t>(iy * w + ix) : arg;
        }
      out[y * ow + xx] = best;
      idx[y * ow + xx] = arg;
    }
  }
}

}  // namespace

Tensor maxPool2dForward(const Tensor& x0, int64_t k, int64_t s, int64_t pad, Tensor* indices) {
  KOLO_CHECK(x0.dim() == 4, "maxPool2d: input must be [N, C, H, W], got ", shapeString(x0.shape()));
  KOLO_CHECK(k > 0 && s > 0 && pad >= 0 && 2 * pad <= k, "maxPool2d: kernel ", k, ", stride ", s, ", padding ", pad);
  Tensor x = x0.contiguous();
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  KOLO_CHECK(h + 2 * pad >= k && w + 2 * pad >= k, "maxPool2d: kernel ", k, " larger than input ",
             shapeString(x.shape()));
  KOLO_CHECK(h * w <= std::numeric_limits<int32_t>::max(), "maxPool2d: plane of ", h, "x", w,
             " too large for i32 indices");
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  Tensor out = Tensor::empty({n, c, oh, ow}, x.dtype());
  Tensor idx = Tensor::empty({n, c, oh, ow}, DType::I32);
  detail::dispatchFloat(x.dtype(), "maxPool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int32_t* pi = idx.data<int32_t>();
    for (int64_t plane = 0; plane < n * c; ++plane) {
      const T* in = px + plane * h * w;
      T* o = po + plane * oh * ow;
      int32_t* oi = pi + plane * oh * ow;
      if (pad > 0) poolPlanePadded(in, h, w, k, s, pad, oh, ow, o, oi);
      else if (k == 2 && s == 2) poolPlane2x2(in, w, oh, ow, o, oi);
      else if (k == 2) poolPlaneNoPad<T, 2>(in, w, k, s, oh, ow, o, oi);
      else if (k == 3) poolPlaneNoPad<T, 3>(in, w, k, s, oh, ow, o, oi);
      else poolPlaneNoPad<T, 0>(in, w, k, s, oh, ow, o, oi);
    }
  });
  if (indices) *indices = idx;
  return out;
}

Tensor maxPool2dBackward(const Tensor& grad0, const Tensor& indices, const Shape& xShape) {
  Tensor grad = grad0.contiguous();
  KOLO_CHECK(xShape.size() == 4 && grad.dim() == 4 && indices.shape() == grad.shape() &&
                 indices.dtype() == DType::I32 && indices.isContiguous(),
             "maxPool2d backward: gradient ", shapeString(grad.shape()), " and indices ",
             shapeString(indices.shape()), " for input ", shapeString(xShape));
  Tensor out = Tensor::empty(xShape, grad.dtype());
  const int64_t planes = xShape[0] * xShape[1], hw = xShape[2] * xShape[3];
  const int64_t ohw = grad.shape()[2] * grad.shape()[3];
  detail::dispatchFloat(grad.dtype(), "maxPool2d backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = grad.data<T>();
    const int32_t* pi = indices.data<int32_t>();
    T* po = out.data<T>();
    // Zero one plane right before scattering into it, while it is in cache.
    for (int64_t plane = 0; plane < planes; ++plane) {
      T* dst = po + plane * hw;
      std::memset(dst, 0, sizeof(T) * hw);
      for (int64_t i = 0; i < ohw; ++i) dst[pi[plane * ohw + i]] += pg[plane * ohw + i];
    }
  });
  return out;
}

}  // namespace kolo::kernels
