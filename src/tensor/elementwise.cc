// Broadcasting elementwise kernels (binary, unary, activation gradients, where).
// Same-shape contiguous operands take a flat loop the compiler vectorises; other cases
// walk rows of the broadcast shape with per-operand strides (0 on broadcast dimensions).
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"
#include "tensor/row_kernels.h"

namespace kolo::kernels {

Shape broadcastShapes(const Shape& a, const Shape& b, const char* op) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    const int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    if (da != db && da != 1 && db != 1)
      KOLO_THROW(InvalidArgument, op, ": shapes ", shapeString(a), " and ", shapeString(b),
                 " cannot be broadcast (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

DType promote(DType a, DType b, const char* op) {
  auto isFloat = [](DType d) { return d == DType::F32 || d == DType::F64; };
  if (!isFloat(a) || !isFloat(b))
    KOLO_THROW(InvalidArgument, op, ": dtypes ", dtypeName(a), " and ", dtypeName(b),
               " (only f32 and f64 compute; convert with to())");
  return (a == DType::F64 || b == DType::F64) ? DType::F64 : DType::F32;
}

const char* binaryName(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Max: return "maximum";
    case BinaryOp::Min: return "minimum";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Eq: return "eq";
  }
  return "binary";
}

template <class T, class F>
void binaryApply(Tensor& out, const Tensor& a, const Tensor& b, F f) {
  T* o = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const int64_t n = out.numel();
  if (a.shape() == out.shape() && b.shape() == out.shape() && a.isContiguous() && b.isContiguous()) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[i]);
    return;
  }
  Tensor ea = expandRaw(a, out.shape());
  Tensor eb = expandRaw(b, out.shape());
  std::array<const int64_t*, 3> st{out.strides().data(), ea.strides().data(), eb.strides().data()};
  detail::stridedRows<3>(out.shape(), st, {0, 0, 0}, [&](auto off, int64_t len, auto in) {
    T* po = o + off[0];
    const T* xa = pa + off[1];
    const T* xb = pb + off[2];
    if (in[1] == 1 && in[2] == 1) {
      for (int64_t i = 0; i < len; ++i) po[i] = f(xa[i], xb[i]);
    } else if (in[1] == 1 && in[2] == 0) {
      const T vb = *xb;
      for (int64_t i = 0; i < len; ++i) po[i] = f(xa[i], vb);
    } else if (in[1] == 0 && in[2] == 1) {
      const T va = *xa;
      for (int64_t i = 0; i < len; ++i) po[i] = f(va, xb[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) po[i] = f(xa[i * in[1]], xb[i * in[2]]);
    }
  });
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a0, const Tensor& b0) {
  const char* name = binaryName(op);
  const DType dt = promote(a0.dtype(), b0.dtype(), name);
  Tensor a = a0.dtype() == dt ? a0 : a0.to(dt);
  Tensor b = b0.dtype() == dt ? b0 : b0.to(dt);
  Tensor out = Tensor::empty(broadcastShapes(a.shape(), b.shape(), name), dt);
  detail::dispatchFloat(dt, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case BinaryOp::Add: binaryApply<T>(out, a, b, [](T x, T y) { return x + y; }); break;
      case BinaryOp::Sub: binaryApply<T>(out, a, b, [](T x, T y) { return x - y; }); break;
      case BinaryOp::Mul: binaryApply<T>(out, a, b, [](T x, T y) { return x * y; }); break;
      case BinaryOp::Div: binaryApply<T>(out, a, b, [](T x, T y) { return x / y; }); break;
      case BinaryOp::Pow: binaryApply<T>(out, a, b, [](T x, T y) { return std::pow(x, y); }); break;
      case BinaryOp::Max: binaryApply<T>(out, a, b, [](T x, T y) { return x > y ? x : y; }); break;
      case BinaryOp::Min: binaryApply<T>(out, a, b, [](T x, T y) { return x < y ? x : y; }); break;
      case BinaryOp::Gt: binaryApply<T>(out, a, b, [](T x, T y) { return T(x > y ? 1 : 0); }); break;
      case BinaryOp::Lt: binaryApply<T>(out, a, b, [](T x, T y) { return T(x < y ? 1 : 0); }); break;
      case BinaryOp::Eq: binaryApply<T>(out, a, b, [](T x, T y) { return T(x == y ? 1 : 0); }); break;
    }
  });
  return out;
}

void addInPlace(Tensor& dst, const Tensor& src0, double alpha) {
  const Shape& shape = dst.shape();
  broadcastShapes(shape, src0.shape(), "addInPlace");
  Tensor src = src0.dtype() == dst.dtype() ? src0 : src0.to(dst.dtype());
  detail::dispatchFloat(dst.dtype(), "addInPlace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T al = static_cast<T>(alpha);
    T* d = dst.data<T>();
    const T* s = src.data<T>();
    if (src.shape() == shape && dst.isContiguous() && src.isContiguous()) {
      const int64_t n = dst.numel();
      if (alpha == 1.0) {
        for (int64_t i = 0; i < n; ++i) d[i] += s[i];
      } else {
        for (int64_t i = 0; i < n; ++i) d[i] += al * s[i];
      }
      return;
    }
    Tensor es = expandRaw(src, shape);
    std::array<const int64_t*, 2> st{dst.strides().data(), es.strides().data()};
    detail::stridedRows<2>(shape, st, {0, 0}, [&](auto off, int64_t len, auto in) {
      for (int64_t i = 0; i < len; ++i) d[off[0] + i * in[0]] += al * s[off[1] + i * in[1]];
    });
  });
}

void scaleInPlace(Tensor& dst, double s) {
  KOLO_CHECK(dst.isContiguous(), "scaleInPlace needs a contiguous tensor");
  detail::dispatchFloat(dst.dtype(), "scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = dst.data<T>();
    const T v = static_cast<T>(s);
    for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] *= v;
  });
}

namespace {

template <class F>
Tensor mapUnary(const Tensor& x0, const char* name, F f) {
  Tensor x = x0.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  detail::dispatchFloat(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) po[i] = static_cast<T>(f(px[i]));
  });
  return out;
}

template <class F>
Tensor mapBinarySame(const Tensor& a0, const Tensor& b0, const char* name, F f) {
  KOLO_CHECK(a0.shape() == b0.shape(), name, ": shapes ", shapeString(a0.shape()), " and ",
             shapeString(b0.shape()));
  Tensor a = a0.contiguous();
  Tensor b = b0.dtype() == a.dtype() ? b0.contiguous() : b0.to(a.dtype());
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  detail::dispatchFloat(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = static_cast<T>(f(pa[i], pb[i]));
  });
  return out;
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  switch (op) {
    case UnaryOp::Neg: return mapUnary(x, "neg", [](auto v) { return -v; });
    case UnaryOp::Exp: return mapUnary(x, "exp", [](auto v) { return std::exp(v); });
    case UnaryOp::Log: return mapUnary(x, "log", [](auto v) { return std::log(v); });
    case UnaryOp::Tanh: return mapUnary(x, "tanh", [](auto v) { return std::tanh(v); });
    case UnaryOp::Sigmoid:
      return mapUnary(x, "sigmoid", [](auto v) { return decltype(v)(1) / (decltype(v)(1) + std::exp(-v)); });
    case UnaryOp::Relu: return mapUnary(x, "relu", [](auto v) { return v > 0 ? v : decltype(v)(0); });
    case UnaryOp::Gelu:
      if (x.dtype() == DType::F32) {
        Tensor xc = x.contiguous();
        Tensor out = Tensor::empty(xc.shape(), DType::F32);
        detail::geluRows(xc.data<float>(), out.data<float>(), xc.numel());
        return out;
      }
      return mapUnary(x, "gelu", [](auto v) {
        using T = decltype(v);
        return static_cast<T>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2)));
      });
    case UnaryOp::Sqrt: return mapUnary(x, "sqrt", [](auto v) { return std::sqrt(v); });
    case UnaryOp::Abs: return mapUnary(x, "abs", [](auto v) { return std::abs(v); });
  }
  KOLO_THROW(InvalidArgument, "unknown unary op");
}

Tensor affineScalar(const Tensor& x, double a, double b) {
  return mapUnary(x, "affine", [a, b](auto v) {
    using T = decltype(v);
    return static_cast<T>(a) * v + static_cast<T>(b);
  });
}

Tensor powScalar(const Tensor& x, double p) {
  if (p == 2.0) return mapUnary(x, "pow", [](auto v) { return v * v; });
  return mapUnary(x, "pow", [p](auto v) { return std::pow(v, static_cast<decltype(v)>(p)); });
}

#if defined(__SSE2__)
namespace {

// float32 bits of the mask 4 at a time with SSE (the baseline of every x86-64 build): a
// compare and a movemask per 4 elements, and per 4 bits a mask from a table for backward.
void packPositiveF32(const float* y, int64_t n, uint8_t* mask) {
  const __m128 zero = _mm_setzero_ps();
  const int64_t whole = n / 8;
  for (int64_t b = 0; b < whole; ++b) {
    const int lo = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(y + 8 * b), zero));
    const int hi = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(y + 8 * b + 4), zero));
    mask[b] = static_cast<uint8_t>(lo | (hi << 4));
  }
  if (whole * 8 < n) {
    uint8_t bits = 0;
    for (int64_t i = whole * 8; i < n; ++i) bits |= static_cast<uint8_t>(y[i] > 0.0f) << (i - whole * 8);
    mask[whole] = bits;
  }
}

void maskGradientF32(float* g, int64_t n, const uint8_t* mask) {
  alignas(16) static const uint32_t kKeep[16][4] = {
      {0, 0, 0, 0}, {~0u, 0, 0, 0}, {0, ~0u, 0, 0}, {~0u, ~0u, 0, 0},
      {0, 0, ~0u, 0}, {~0u, 0, ~0u, 0}, {0, ~0u, ~0u, 0}, {~0u, ~0u, ~0u, 0},
      {0, 0, 0, ~0u}, {~0u, 0, 0, ~0u}, {0, ~0u, 0, ~0u}, {~0u, ~0u, 0, ~0u},
      {0, 0, ~0u, ~0u}, {~0u, 0, ~0u, ~0u}, {0, ~0u, ~0u, ~0u}, {~0u, ~0u, ~0u, ~0u}};
  const int64_t whole = n / 8;
  for (int64_t b = 0; b < whole; ++b) {
    const uint8_t bits = mask[b];
    if (bits == 0xFF) continue;
    float* v = g + 8 * b;
    _mm_storeu_ps(v, _mm_and_ps(_mm_loadu_ps(v), _mm_load_ps(reinterpret_cast<const float*>(kKeep[bits & 15]))));
    _mm_storeu_ps(v + 4, _mm_and_ps(_mm_loadu_ps(v + 4), _mm_load_ps(reinterpret_cast<const float*>(kKeep[bits >> 4]))));
  }
  for (int64_t i = whole * 8; i < n; ++i)
    if (!((mask[whole] >> (i - whole * 8)) & 1)) g[i] = 0.0f;
}

}  // namespace
#endif

Tensor positiveMask(const Tensor& y0) {
  Tensor y = y0.contiguous();
  const int64_t n = y.numel();
  Tensor mask = Tensor::empty({(n + 7) / 8}, DType::U8);
  uint8_t* pm = mask.data<uint8_t>();
#if defined(__SSE2__)
  if (y.dtype() == DType::F32) {
    packPositiveF32(y.data<float>(), n, pm);
    return mask;
  }
#endif
  detail::dispatchFloat(y.dtype(), "relu mask", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* py = y.data<T>();
    for (int64_t b = 0; b * 8 < n; ++b) {
      uint8_t bits = 0;
      for (int64_t k = 0; k < 8 && 8 * b + k < n; ++k) bits |= static_cast<uint8_t>(py[8 * b + k] > T(0)) << k;
      pm[b] = bits;
    }
  });
  return mask;
}

void reluBackwardInPlace(Tensor& grad, const Tensor& mask) {
  const int64_t n = grad.numel();
  KOLO_CHECK(grad.isContiguous() && mask.dtype() == DType::U8 && mask.numel() == (n + 7) / 8,
             "relu backward in place: gradient ", shapeString(grad.shape()), " for a mask of ", mask.numel(),
             " bytes");
  const uint8_t* pm = mask.data<uint8_t>();
#if defined(__SSE2__)
  if (grad.dtype() == DType::F32) {
    maskGradientF32(grad.data<float>(), n, pm);
    return;
  }
#endif
  detail::dispatchFloat(grad.dtype(), "relu backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pg = grad.data<T>();
    for (int64_t i = 0; i < n; ++i)
      if (!((pm[i / 8] >> (i % 8)) & 1)) pg[i] = T(0);
  });
}

Tensor reluBackward(const Tensor& grad, const Tensor& mask) {
  Tensor out = grad.isContiguous() ? grad.clone() : grad.contiguous();  // never grad's own buffer
  reluBackwardInPlace(out, mask);
  return out;
}

Tensor geluBackward(const Tensor& grad, const Tensor& x) {
  if (grad.dtype() == DType::F32 && x.dtype() == DType::F32 && grad.shape() == x.shape()) {
    Tensor g = grad.contiguous(), xc = x.contiguous();
    Tensor out = Tensor::empty(xc.shape(), DType::F32);
    detail::geluBackwardRows(g.data<float>(), xc.data<float>(), out.data<float>(), xc.numel());
    return out;
  }
  return mapBinarySame(grad, x, "gelu backward", [](auto g, auto v) {
    const double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
    const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
    return g * (cdf + v * pdf);
  });
}

Tensor tanhBackward(const Tensor& grad, const Tensor& y) {
  return mapBinarySame(grad, y, "tanh backward", [](auto g, auto v) { return g * (1 - v * v); });
}

Tensor sigmoidBackward(const Tensor& grad, const Tensor& y) {
  return mapBinarySame(grad, y, "sigmoid backward", [](auto g, auto v) { return g * v * (1 - v); });
}

Tensor where(const Tensor& cond0, const Tensor& a0, const Tensor& b0) {
  const DType dt = promote(a0.dtype(), b0.dtype(), "where");
  Shape shape = broadcastShapes(broadcastShapes(cond0.shape(), a0.shape(), "where"), b0.shape(), "where");
  // Normalise the condition to 0/1 bytes (to(U8) would wrap values such as 256).
  Tensor mask = Tensor::empty(cond0.shape(), DType::U8);
  {
    Tensor c = cond0.contiguous();
    uint8_t* pm = mask.data<uint8_t>();
    detail::dispatchAll(c.dtype(), [&](auto tag) {
      using C = typename decltype(tag)::type;
      const C* pc = static_cast<const C*>(c.rawData());
      for (int64_t i = 0, n = c.numel(); i < n; ++i) pm[i] = detail::toDouble(pc[i]) != 0.0;
    });
  }
  Tensor cond = expandRaw(mask, shape);
  Tensor a = expandRaw(a0.to(dt), shape);
  Tensor b = expandRaw(b0.to(dt), shape);
  Tensor out = Tensor::empty(shape, dt);
  detail::dispatchFloat(dt, "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const uint8_t* pc = cond.data<uint8_t>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    std::array<const int64_t*, 4> st{out.strides().data(), cond.strides().data(), a.strides().data(),
                                     b.strides().data()};
    detail::stridedRows<4>(shape, st, {0, 0, 0, 0}, [&](auto off, int64_t len, auto in) {
      for (int64_t i = 0; i < len; ++i)
        po[off[0] + i * in[0]] = pc[off[1] + i * in[1]] ? pa[off[2] + i * in[2]] : pb[off[3] + i * in[3]];
    });
  });
  return out;
}

}  // namespace kolo::kernels
