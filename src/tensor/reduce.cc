// Reductions: sum over any set of dimensions (also used to undo broadcasting in
// gradients) and max over one dimension with argmax indices for its backward.
#include <limits>
#include <type_traits>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"
#include "tensor/vector_math.h"

namespace kolo::kernels {

namespace {

// out[0..cols) += each of the rows of x (rows x cols, contiguous), row after row: a linear
// layer's bias gradient, the column sums of its output gradient, in the order the strided
// path below adds them, without its call per row.
KOLO_VECTOR_CLONES void addRows(const float* __restrict x, int64_t rows, int64_t cols, float* __restrict out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[j] += x[r * cols + j];
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t nd = x.dim();
  std::vector<bool> reduce(nd, dims.empty());
  for (int64_t d : dims) reduce[wrapDim(d, nd, "sum")] = true;
  Shape kept = x.shape();
  Shape squeezed;
  for (int64_t i = 0; i < nd; ++i) {
    if (reduce[i]) kept[i] = 1;
    else squeezed.push_back(x.shape()[i]);
  }
  Tensor out = Tensor::zeros(kept, x.dtype());
  detail::dispatchFloat(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.data<T>();
    const T* px = x.data<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (nd == 2 && reduce[0] && !reduce[1] && x.isContiguous()) {
        addRows(px, x.shape()[0], x.shape()[1], po);
        return;
      }
    }
    if (dims.empty() && x.isContiguous()) {
      double acc = 0.0;
      for (int64_t i = 0, n = x.numel(); i < n; ++i) acc += px[i];
      po[0] = static_cast<T>(acc);
      return;
    }
    std::vector<int64_t> ostr = out.strides();
    for (int64_t i = 0; i < nd; ++i)
      if (reduce[i]) ostr[i] = 0;
    std::array<const int64_t*, 2> st{ostr.data(), x.strides().data()};
    detail::stridedRows<2>(x.shape(), st, {0, 0}, [&](auto off, int64_t len, auto in) {
      T* o = po + off[0];
      const T* s = px + off[1];
      if (in[0] == 0) {
        double acc = 0.0;
        for (int64_t i = 0; i < len; ++i) acc += s[i * in[1]];
        *o += static_cast<T>(acc);
      } else if (in[1] == 1 && in[0] == 1) {
        for (int64_t i = 0; i < len; ++i) o[i] += s[i];
      } else {
        for (int64_t i = 0; i < len; ++i) o[i * in[0]] += s[i * in[1]];
      }
    });
  });
  return keepdim ? out : reshapeRaw(out, squeezed);
}

Tensor sumToShape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t nd = x.dim();
  const int64_t lead = nd - static_cast<int64_t>(shape.size());
  KOLO_CHECK(lead >= 0, "sumToShape: ", shapeString(x.shape()), " has fewer dimensions than ",
             shapeString(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < nd; ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && x.shape()[i] != 1) {
      dims.push_back(i);
    } else {
      KOLO_CHECK(shape[i - lead] == x.shape()[i], "sumToShape: ", shapeString(x.shape()),
                 " does not broadcast from ", shapeString(shape));
    }
  }
  if (dims.empty()) return reshapeRaw(x, shape);
  return reshapeRaw(sum(x, dims, true), shape);
}

Tensor maxDim(const Tensor& x0, int64_t dim, bool keepdim, Tensor* indices) {
  const int64_t nd = x0.dim();
  dim = wrapDim(dim, nd, "max");
  Tensor x = x0.contiguous();
  const int64_t n = x.shape()[dim];
  KOLO_CHECK(n > 0, "max over an empty dimension of shape ", shapeString(x.shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= x.shape()[i];
  for (int64_t i = dim + 1; i < nd; ++i) inner *= x.shape()[i];
  Shape kept = x.shape();
  kept[dim] = 1;
  Tensor values = Tensor::empty(kept, x.dtype());
  Tensor idx = Tensor::empty(kept, DType::I64);
  detail::dispatchFloat(x.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = idx.data<int64_t>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* base = px + o * n * inner + i;
        T best = base[0];
        int64_t arg = 0;
        for (int64_t k = 1; k < n; ++k) {
          const T v = base[k * inner];
          if (v > best || (v != v && best == best)) {
            best = v;
            arg = k;
          }
        }
        pv[o * inner + i] = best;
        pi[o * inner + i] = arg;
      }
    }
  });
  if (!keepdim) {
    Shape squeezed = x.shape();
    squeezed.erase(squeezed.begin() + dim);
    values = reshapeRaw(values, squeezed);
    idx = reshapeRaw(idx, squeezed);
  }
  if (indices) *indices = idx;
  return values;
}

Tensor maxDimBackward(const Tensor& grad0, const Tensor& indices0, const Shape& xShape, int64_t dim,
                      bool keepdim) {
  const int64_t nd = static_cast<int64_t>(xShape.size());
  dim = wrapDim(dim, nd, "max backward");
  Shape kept = xShape;
  kept[dim] = 1;
  Tensor grad = reshapeRaw(grad0.contiguous(), kept);
  Tensor indices = reshapeRaw(indices0.contiguous(), kept);
  Tensor out = Tensor::zeros(xShape, grad.dtype());
  const int64_t n = xShape[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= xShape[i];
  for (int64_t i = dim + 1; i < nd; ++i) inner *= xShape[i];
  detail::dispatchFloat(grad.dtype(), "max backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = grad.data<T>();
    const int64_t* pi = indices.data<int64_t>();
    T* po = out.data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i)
        po[(o * n + pi[o * inner + i]) * inner + i] += pg[o * inner + i];
  });
  (void)keepdim;
  return out;
}

}  // namespace kolo::kernels
