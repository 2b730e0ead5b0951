// GEMM-backed kernels: 2-d and batched matmul through CBLAS (transposed views are passed
// as BLAS transpose flags, not copied). Convolution lives in conv.cc, pooling in max_pool.cc.
#include <cblas.h>

#include <cstring>
#include <limits>

#include "kolo/precision.h"
#include "tensor/dispatch.h"
#include "tensor/gemm.h"
#include "tensor/kernels.h"

namespace kolo::kernels {

namespace {

// How a 2-d operand is handed to BLAS: the base pointer view, transpose flag, leading dim.
struct GemmOperand {
  Tensor t;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 0;
};

GemmOperand gemmOperand(const Tensor& x) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
  if ((s1 == 1 || cols == 1) && s0 >= std::max<int64_t>(cols, 1)) return {x, CblasNoTrans, s0};
  if ((s0 == 1 || rows == 1) && s1 >= std::max<int64_t>(rows, 1)) return {x, CblasTrans, s1};
  Tensor c = x.contiguous();
  return {c, CblasNoTrans, std::max<int64_t>(cols, 1)};
}

}  // namespace

Tensor matmul2d(const Tensor& a, const Tensor& b, Tensor* out, double beta) {
  KOLO_CHECK(a.dim() == 2 && b.dim() == 2 && a.shape()[1] == b.shape()[0], "matmul: shapes ",
             shapeString(a.shape()), " and ", shapeString(b.shape()), " are not aligned");
  KOLO_CHECK(a.dtype() == b.dtype(), "matmul: dtypes ", dtypeName(a.dtype()), " and ", dtypeName(b.dtype()));
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor c;
  if (out && out->defined()) {
    KOLO_CHECK(out->shape() == (Shape{m, n}) && out->isContiguous() && out->dtype() == a.dtype(),
               "matmul: output of shape ", shapeString(out->shape()), " cannot hold the [", m, ", ", n,
               "] result");
    c = *out;
  } else {
    c = Tensor::empty({m, n}, a.dtype());
    beta = 0.0;
  }
  if (m == 0 || n == 0) return c;
  if (k == 0) {
    if (beta == 0.0) c.fill(0.0);
    else scaleInPlace(c, beta);
    return c;
  }
  GemmOperand ga = gemmOperand(a), gb = gemmOperand(b);
  detail::dispatchFloat(a.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::gemm<T>(ga.trans, gb.trans, m, n, k, T(1), ga.t.template data<T>(), ga.ld, gb.t.template data<T>(), gb.ld,
            static_cast<T>(beta), c.template data<T>(), n);
  });
  if (out) *out = c;
  return c;
}

Tensor linearForward(const Tensor& x, const Tensor& weight, const Tensor& bias0, Tensor* gelu) {
  KOLO_CHECK(x.dim() == 2 && weight.dim() == 2 && x.shape()[1] == weight.shape()[1], "linear: input ",
             shapeString(x.shape()), " does not match weight ", shapeString(weight.shape()));
  KOLO_CHECK(!gelu || (bias0.defined() && x.dtype() == DType::F32), "linear with GELU: needs an f32 input and a bias");
  const int64_t m = x.shape()[0], k = x.shape()[1], n = weight.shape()[0];
  Tensor bias = bias0.defined() ? bias0.contiguous() : Tensor();
  const bool rows = x.strides()[1] == 1 && x.strides()[0] >= k && weight.strides()[1] == 1 && weight.strides()[0] >= k;
  if (rows && x.dtype() == DType::F32 && weight.dtype() == DType::F32 &&
      (!bias.defined() || bias.dtype() == DType::F32) && matmulPrecision() == MatmulPrecision::F32) {
    Tensor out = Tensor::empty({m, n}, DType::F32);
    Tensor act = gelu ? Tensor::empty({m, n}, DType::F32) : Tensor();
    if (detail::smallLinear(m, n, k, x.data<float>(), x.strides()[0], weight.data<float>(), weight.strides()[0],
                            bias.defined() ? bias.data<float>() : nullptr, out.data<float>(), n,
                            gelu ? act.data<float>() : nullptr, n)) {
      if (gelu) *gelu = act;
      return out;
    }
  }
  if (gelu) {
    Tensor pre = matmul2d(x, transposeRaw(weight, 0, 1));
    *gelu = biasGeluForward(pre, bias);
    return pre;
  }
  Tensor out = Tensor::empty({m, n}, x.dtype());
  double beta = 0.0;
  if (bias.defined()) {
    KOLO_CHECK(bias.dim() == 1 && bias.shape()[0] == n, "linear: bias ", shapeString(bias.shape()), " for ", n,
               " outputs");
    // Prefill each row with the bias and let the GEMM accumulate onto it (beta = 1).
    copyInto(out, expandRaw(bias, {m, n}));
    beta = 1.0;
  }
  return matmul2d(x, transposeRaw(weight, 0, 1), &out, beta);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  KOLO_CHECK(a.dim() == 3 && b.dim() == 3 && a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1],
             "bmm: shapes ", shapeString(a.shape()), " and ", shapeString(b.shape()), " are not aligned");
  const int64_t batch = a.shape()[0], m = a.shape()[1], n = b.shape()[2];
  Tensor c = Tensor::empty({batch, m, n}, a.dtype());
  for (int64_t i = 0; i < batch; ++i) {
    Tensor ci = sliceRaw(c, 0, i, i + 1, 1);
    ci = viewRaw(ci, {m, n});
    Tensor ai = squeezeRaw(sliceRaw(a, 0, i, i + 1, 1), 0);
    Tensor bi = squeezeRaw(sliceRaw(b, 0, i, i + 1, 1), 0);
    matmul2d(ai, bi, &ci, 0.0);
  }
  return c;
}

}  // namespace kolo::kernels
