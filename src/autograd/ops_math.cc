// Differentiable elementwise arithmetic, elementwise functions, reductions and matrix
// products. Backward closures run with grad mode off and reduce broadcast gradients back
// to each input's shape.
#include <cmath>

#include "autograd/sole_owner.h"
#include "kolo/ops.h"
#include "tensor/kernels.h"

namespace kolo {

using autograd::record;
using autograd::solelyOwned;
using kernels::BinaryOp;
using Grads = std::vector<Tensor>;

namespace {
bool req(const Tensor& t) { return t.defined() && t.requiresGrad(); }
Tensor bin(BinaryOp op, const Tensor& a, const Tensor& b) { return kernels::binary(op, a, b); }
}  // namespace

// ---------------------------------------------------------------- arithmetic

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::Add, a, b);
  Shape sa = a.shape(), sb = b.shape();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, "AddBackward", [=](const Tensor& g) {
    return Grads{ra ? kernels::sumToShape(g, sa) : Tensor(), rb ? kernels::sumToShape(g, sb) : Tensor()};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::Sub, a, b);
  Shape sa = a.shape(), sb = b.shape();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, "SubBackward", [=](const Tensor& g) {
    return Grads{ra ? kernels::sumToShape(g, sa) : Tensor(),
                 rb ? kernels::sumToShape(kernels::unary(kernels::UnaryOp::Neg, g), sb) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::Mul, a, b);
  if (!autograd::needsRecord({&a, &b})) return out;
  Tensor ad = a.detach(), bd = b.detach();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, "MulBackward", [=](const Tensor& g) {
    return Grads{ra ? kernels::sumToShape(bin(BinaryOp::Mul, g, bd), ad.shape()) : Tensor(),
                 rb ? kernels::sumToShape(bin(BinaryOp::Mul, g, ad), bd.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::Div, a, b);
  if (!autograd::needsRecord({&a, &b})) return out;
  Tensor ad = a.detach(), bd = b.detach();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, "DivBackward", [=](const Tensor& g) {
    Tensor ga, gb;
    if (ra) ga = kernels::sumToShape(bin(BinaryOp::Div, g, bd), ad.shape());
    if (rb) {
      // d(a/b)/db = -a / b^2
      Tensor t = bin(BinaryOp::Div, bin(BinaryOp::Mul, g, ad), kernels::powScalar(bd, 2.0));
      gb = kernels::sumToShape(kernels::unary(kernels::UnaryOp::Neg, t), bd.shape());
    }
    return Grads{ga, gb};
  });
}

namespace {
Tensor minMax(const Tensor& a, const Tensor& b, bool isMax) {
  Tensor out = bin(isMax ? BinaryOp::Max : BinaryOp::Min, a, b);
  if (!autograd::needsRecord({&a, &b})) return out;
  // Ties go to a, as the selection mask a >= b (max) or a <= b (min) says.
  Tensor pickA = bin(isMax ? BinaryOp::Lt : BinaryOp::Gt, a.detach(), b.detach());  // 1 where b wins
  pickA = kernels::affineScalar(pickA, -1.0, 1.0);
  Shape sa = a.shape(), sb = b.shape();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, isMax ? "MaximumBackward" : "MinimumBackward", [=](const Tensor& g) {
    Tensor ga = bin(BinaryOp::Mul, g, pickA);
    Tensor gb = bin(BinaryOp::Sub, g, ga);
    return Grads{ra ? kernels::sumToShape(ga, sa) : Tensor(), rb ? kernels::sumToShape(gb, sb) : Tensor()};
  });
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return minMax(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return minMax(a, b, false); }

Tensor affine(const Tensor& x, double scale, double shift) {
  Tensor out = kernels::affineScalar(x, scale, shift);
  return record(out, {x}, "AffineBackward",
                [scale](const Tensor& g) { return Grads{kernels::affineScalar(g, scale, 0.0)}; });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double s) { return affine(a, 1.0, s); }
Tensor operator+(double s, const Tensor& a) { return affine(a, 1.0, s); }
Tensor operator-(const Tensor& a, double s) { return affine(a, 1.0, -s); }
Tensor operator-(double s, const Tensor& a) { return affine(a, -1.0, s); }
Tensor operator*(const Tensor& a, double s) { return affine(a, s, 0.0); }
Tensor operator*(double s, const Tensor& a) { return affine(a, s, 0.0); }
Tensor operator/(const Tensor& a, double s) { return affine(a, 1.0 / s, 0.0); }
Tensor operator/(double s, const Tensor& a) { return div(Tensor::scalar(s, a.dtype()), a); }

// ---------------------------------------------------------------- elementwise functions

Tensor neg(const Tensor& x) { return affine(x, -1.0, 0.0); }

Tensor exp(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Exp, x);
  if (!autograd::needsRecord({&x})) return out;
  Tensor y = out.detach();
  return record(out, {x}, "ExpBackward", [y](const Tensor& g) { return Grads{bin(BinaryOp::Mul, g, y)}; });
}

Tensor log(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Log, x);
  if (!autograd::needsRecord({&x})) return out;
  Tensor xd = x.detach();
  return record(out, {x}, "LogBackward", [xd](const Tensor& g) { return Grads{bin(BinaryOp::Div, g, xd)}; });
}

Tensor sqrt(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Sqrt, x);
  if (!autograd::needsRecord({&x})) return out;
  Tensor y = out.detach();
  return record(out, {x}, "SqrtBackward", [y](const Tensor& g) {
    return Grads{bin(BinaryOp::Div, g, kernels::affineScalar(y, 2.0, 0.0))};
  });
}

Tensor tanh(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Tanh, x);
  if (!autograd::needsRecord({&x})) return out;
  Tensor y = out.detach();
  return record(out, {x}, "TanhBackward", [y](const Tensor& g) { return Grads{kernels::tanhBackward(g, y)}; });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Sigmoid, x);
  if (!autograd::needsRecord({&x})) return out;
  Tensor y = out.detach();
  return record(out, {x}, "SigmoidBackward",
                [y](const Tensor& g) { return Grads{kernels::sigmoidBackward(g, y)}; });
}

Tensor relu(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Relu, x);
  if (!autograd::needsRecord({&x})) return out;
  // A bit per element, not the output: a consumer that does not keep its input (a pooling
  // layer keeps indices) lets the output go after forward.
  Tensor mask = kernels::positiveMask(out);
  return record(out, {x}, "ReluBackward", [mask](const Tensor& g) {
    if (solelyOwned(g)) {
      Tensor inPlace = g;
      kernels::reluBackwardInPlace(inPlace, mask);
      return Grads{inPlace};
    }
    return Grads{kernels::reluBackward(g, mask)};
  });
}

Tensor gelu(const Tensor& x) {
  Tensor out = kernels::unary(kernels::UnaryOp::Gelu, x);
  if (!autograd::needsRecord({&x})) return out;
  Tensor xd = x.detach();
  return record(out, {x}, "GeluBackward", [xd](const Tensor& g) { return Grads{kernels::geluBackward(g, xd)}; });
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor out = kernels::powScalar(x, exponent);
  if (!autograd::needsRecord({&x})) return out;
  Tensor xd = x.detach();
  return record(out, {x}, "PowBackward", [xd, exponent](const Tensor& g) {
    Tensor d = kernels::affineScalar(kernels::powScalar(xd, exponent - 1.0), exponent, 0.0);
    return Grads{bin(BinaryOp::Mul, g, d)};
  });
}

// ---------------------------------------------------------------- reductions

namespace {
// Broadcasts a reduced gradient back over the reduced dimensions of `shape`.
Tensor expandReduced(const Tensor& g, const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor k = g;
  if (!keepdim) {
    Shape kept = shape;
    const int64_t nd = static_cast<int64_t>(shape.size());
    if (dims.empty()) {
      for (auto& s : kept) s = 1;
    } else {
      for (int64_t d : dims) kept[kernels::wrapDim(d, nd, "sum")] = 1;
    }
    k = kernels::reshapeRaw(g.contiguous(), kept);
  }
  return kernels::expandRaw(k, shape).contiguous();
}

int64_t reducedCount(const Shape& shape, const std::vector<int64_t>& dims) {
  if (dims.empty()) return shapeNumel(shape);
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[kernels::wrapDim(d, static_cast<int64_t>(shape.size()), "mean")];
  return n;
}
}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::sum(x, dims, keepdim);
  Shape shape = x.shape();
  return record(out, {x}, "SumBackward",
                [=](const Tensor& g) { return Grads{expandReduced(g, shape, dims, keepdim)}; });
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const double scale = 1.0 / static_cast<double>(reducedCount(x.shape(), dims));
  Tensor out = kernels::sum(x, dims, keepdim);
  kernels::scaleInPlace(out, scale);
  Shape shape = x.shape();
  return record(out, {x}, "MeanBackward", [=](const Tensor& g) {
    Tensor e = expandReduced(g, shape, dims, keepdim);
    kernels::scaleInPlace(e, scale);
    return Grads{e};
  });
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  Tensor indices;
  Tensor out = kernels::maxDim(x, dim, keepdim, &indices);
  Shape shape = x.shape();
  return record(out, {x}, "MaxBackward", [=](const Tensor& g) {
    return Grads{kernels::maxDimBackward(g, indices, shape, dim, keepdim)};
  });
}

Tensor max(const Tensor& x) { return max(x.reshape({-1}), 0, false); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  Tensor indices;
  kernels::maxDim(x, dim, keepdim, &indices);
  return indices;
}

// ---------------------------------------------------------------- linear algebra

namespace {
Tensor matmul2dOp(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::matmul2d(a, b);
  if (!autograd::needsRecord({&a, &b})) return out;
  bool ra = req(a), rb = req(b);
  // Each operand only for the other's gradient (see linear).
  Tensor ad = rb ? a.detach() : Tensor(), bd = ra ? b.detach() : Tensor();
  const Shape bShape = b.shape();
  const DType bDtype = b.dtype();
  return record(out, {a, b}, "MmBackward", [=](const Tensor& g) {
    Tensor ga = ra ? kernels::matmul2d(g, kernels::transposeRaw(bd, 0, 1)) : Tensor();
    Tensor gb;
    autograd::GradTarget target;
    if (rb) {
      if (autograd::takeGradTarget(1, bShape, bDtype, &target))
        kernels::matmul2d(kernels::transposeRaw(ad, 0, 1), g, &target.buffer, target.accumulate ? 1.0 : 0.0);
      else
        gb = kernels::matmul2d(kernels::transposeRaw(ad, 0, 1), g);
    }
    return Grads{ga, gb};
  });
}
}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::bmm(a, b);
  if (!autograd::needsRecord({&a, &b})) return out;
  Tensor ad = a.detach(), bd = b.detach();
  bool ra = req(a), rb = req(b);
  return record(out, {a, b}, "BmmBackward", [=](const Tensor& g) {
    return Grads{ra ? kernels::bmm(g, kernels::transposeRaw(bd, 1, 2)) : Tensor(),
                 rb ? kernels::bmm(kernels::transposeRaw(ad, 1, 2), g) : Tensor()};
  });
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  KOLO_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: scalar operand, shapes ", shapeString(a.shape()), " and ",
             shapeString(b.shape()));
  const int64_t k = a.shape().back();
  const int64_t kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  if (k != kb)
    KOLO_THROW(InvalidArgument, "matmul: shapes ", shapeString(a.shape()), " and ", shapeString(b.shape()),
               " cannot be multiplied (", k, " vs ", kb, ")");
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  if (a.dim() == 2 && b.dim() == 2) return matmul2dOp(a, b);
  if (b.dim() == 2) {
    Shape outShape(a.shape().begin(), a.shape().end() - 1);
    outShape.push_back(b.shape()[1]);
    return matmul2dOp(a.reshape({-1, k}), b).reshape(outShape);
  }
  // Broadcast the batch dimensions, fold them into one, and run bmm.
  Shape batchA(a.shape().begin(), a.shape().end() - 2), batchB(b.shape().begin(), b.shape().end() - 2);
  Shape batch = kernels::broadcastShapes(batchA, batchB, "matmul");
  const int64_t m = a.shape()[a.dim() - 2], n = b.shape().back();
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  const int64_t nb = shapeNumel(batch);
  Tensor out = bmm(a.expand(ea).reshape({nb, m, k}), b.expand(eb).reshape({nb, k, n}));
  Shape outShape = batch;
  outShape.insert(outShape.end(), {m, n});
  return out.reshape(outShape);
}

namespace {

/// The input and weight gradients of y = x W^T + b from the output gradient g (M, N):
/// dX = g W when `wd` was kept (the input needs a gradient), dW = g^T X when `xd` was kept,
/// written straight into the weight's gradient buffer when the engine offers it.
std::pair<Tensor, Tensor> linearInputWeightGrads(const Tensor& g, const Tensor& xd, const Tensor& wd,
                                                 const Shape& xShape, const Shape& wShape, DType wDtype) {
  Tensor gx, gw;
  if (wd.defined()) gx = kernels::reshapeRaw(kernels::matmul2d(g, wd), xShape);
  if (xd.defined()) {
    autograd::GradTarget target;
    if (autograd::takeGradTarget(1, wShape, wDtype, &target))
      kernels::matmul2d(kernels::transposeRaw(g, 0, 1), xd, &target.buffer, target.accumulate ? 1.0 : 0.0);
    else
      gw = kernels::matmul2d(kernels::transposeRaw(g, 0, 1), xd);
  }
  return {gx, gw};
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  KOLO_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ", shapeString(weight.shape()));
  KOLO_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1], "linear: input ", shapeString(x.shape()),
             " does not match weight ", shapeString(weight.shape()), " (in_features ", weight.shape()[1], ")");
  const int64_t in = weight.shape()[1], outF = weight.shape()[0];
  Tensor x2 = kernels::reshapeRaw(x, {-1, in});
  KOLO_CHECK(!bias.defined() || (bias.dim() == 1 && bias.shape()[0] == outF), "linear: bias ",
             shapeString(bias.shape()), " for ", outF, " outputs");
  Tensor out = kernels::linearForward(x2, weight, bias);  // (M, N), the bias in the GEMM's store
  Shape outShape(x.shape().begin(), x.shape().end() - 1);
  outShape.push_back(outF);
  if (x.dim() != 2) out = kernels::reshapeRaw(out, outShape);
  if (!autograd::needsRecord({&x, &weight, &bias})) return out;
  bool rx = req(x), rw = req(weight), rb = req(bias);
  // Each operand is kept only for the gradient that reads it (dX = dY W, dW = dY^T X): a
  // layer whose input needs no gradient holds no reference to its weight, which fully
  // sharded data parallelism relies on to skip gathering it for backward.
  Tensor xd = rw ? x2.detach() : Tensor(), wd = rx ? weight.detach() : Tensor();
  const Shape xShape = x.shape(), wShape = weight.shape();
  const DType wDtype = weight.dtype();
  return record(out, {x, weight, bias}, "LinearBackward", [=](const Tensor& g0) {
    Tensor g = kernels::reshapeRaw(g0, {-1, outF});
    auto [gx, gw] = linearInputWeightGrads(g, xd, wd, xShape, wShape, wDtype);
    Tensor gb = rb ? kernels::sum(g, {0}, false) : Tensor();
    return Grads{gx, gw, gb};
  });
}

Tensor linearGelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (x.dtype() != DType::F32 || weight.dtype() != DType::F32 || !bias.defined() || bias.dtype() != DType::F32)
    return gelu(linear(x, weight, bias));
  KOLO_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.shape().back() == weight.shape()[1], "linearGelu: input ",
             shapeString(x.shape()), " does not match weight ", shapeString(weight.shape()));
  KOLO_CHECK(bias.dim() == 1 && bias.shape()[0] == weight.shape()[0], "linearGelu: bias ", shapeString(bias.shape()),
             " for ", weight.shape()[0], " outputs");
  const int64_t in = weight.shape()[1], outF = weight.shape()[0];
  Tensor x2 = kernels::reshapeRaw(x, {-1, in});
  Tensor out;
  Tensor pre = kernels::linearForward(x2, weight, bias, &out);  // (M, N) with the bias; out = gelu(pre)
  Shape outShape(x.shape().begin(), x.shape().end() - 1);
  outShape.push_back(outF);
  if (x.dim() != 2) out = kernels::reshapeRaw(out, outShape);
  if (!autograd::needsRecord({&x, &weight, &bias})) return out;
  bool rx = req(x), rw = req(weight), rb = req(bias);
  // As linear: each operand only for the gradient that reads it.
  Tensor xd = rw ? x2.detach() : Tensor(), wd = rx ? weight.detach() : Tensor();
  const Shape xShape = x.shape(), wShape = weight.shape();
  return record(out, {x, weight, bias}, "LinearGeluBackward", [=](const Tensor& g0) {
    Tensor gb;
    Tensor g = kernels::biasGeluBackward(kernels::reshapeRaw(g0, {-1, outF}), pre, rb ? &gb : nullptr);
    auto [gx, gw] = linearInputWeightGrads(g, xd, wd, xShape, wShape, DType::F32);
    return Grads{gx, gw, gb};
  });
}

}  // namespace kolo
