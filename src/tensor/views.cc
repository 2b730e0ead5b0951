// Raw views (reshape, transpose, permute, slice, expand, squeeze) and strided copies.
// Views share storage with their source and differ only in shape, strides and offset.
#include <algorithm>
#include <cstring>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"

namespace kolo::kernels {

namespace {
Tensor withGeometry(const Tensor& x, Shape shape, std::vector<int64_t> strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl()->storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}
}  // namespace

int64_t wrapDim(int64_t d, int64_t nd, const char* op) {
  const int64_t w = d < 0 ? d + nd : d;
  if (w < 0 || w >= nd) KOLO_THROW(InvalidArgument, op, ": dimension ", d, " out of range for rank ", nd);
  return w;
}

void copyInto(Tensor& dst, const Tensor& src) {
  KOLO_CHECK(dst.shape() == src.shape(), "copy: shape ", shapeString(src.shape()), " into ",
             shapeString(dst.shape()));
  if (dst.dtype() == src.dtype() && dst.isContiguous() && src.isContiguous()) {
    if (dst.rawData() != src.rawData()) std::memmove(dst.rawData(), src.rawData(), dst.nbytes());
    return;
  }
  detail::dispatchAll(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    detail::dispatchAll(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      D* d = static_cast<D*>(dst.rawData());
      const S* s = static_cast<const S*>(src.rawData());
      std::array<const int64_t*, 2> st{dst.strides().data(), src.strides().data()};
      detail::stridedRows<2>(dst.shape(), st, {0, 0}, [&](auto off, int64_t n, auto in) {
        D* dp = d + off[0];
        const S* sp = s + off[1];
        if (in[0] == 1 && in[1] == 1) {
          for (int64_t i = 0; i < n; ++i) dp[i] = detail::convertElement<D>(sp[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) dp[i * in[0]] = detail::convertElement<D>(sp[i * in[1]]);
        }
      });
    });
  });
}

Shape inferShape(const Shape& shape, int64_t numel, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int64_t inferred = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      KOLO_CHECK(inferred < 0, "reshape ", shapeString(from), " -> ", shapeString(shape),
                 ": only one -1 allowed");
      inferred = static_cast<int64_t>(i);
    } else {
      KOLO_CHECK(out[i] >= 0, "reshape to invalid shape ", shapeString(shape));
      known *= out[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || numel % known != 0)
      KOLO_THROW(InvalidArgument, "cannot reshape ", shapeString(from), " (", numel, " elements) to ",
                 shapeString(shape));
    out[inferred] = numel / known;
  } else if (known != numel) {
    KOLO_THROW(InvalidArgument, "cannot reshape ", shapeString(from), " (", numel, " elements) to ",
               shapeString(shape), " (", known, " elements)");
  }
  return out;
}

namespace {
// Strides that let `newShape` view memory laid out as (oldShape, oldStrides), or false.
bool viewStrides(const Shape& oldShape, const std::vector<int64_t>& oldStrides, const Shape& newShape,
                 std::vector<int64_t>& newStrides) {
  newStrides.assign(newShape.size(), 0);
  if (oldShape.empty()) {
    for (auto& s : newStrides) s = 1;
    return true;
  }
  int64_t viewD = static_cast<int64_t>(newShape.size()) - 1;
  int64_t chunkBase = oldStrides.back();
  int64_t tensorNumel = 1, viewNumel = 1;
  for (int64_t td = static_cast<int64_t>(oldShape.size()) - 1; td >= 0; --td) {
    tensorNumel *= oldShape[td];
    if (td == 0 || (oldShape[td - 1] != 1 && oldStrides[td - 1] != tensorNumel * chunkBase)) {
      while (viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] == 1)) {
        newStrides[viewD] = viewNumel * chunkBase;
        viewNumel *= newShape[viewD];
        --viewD;
      }
      if (viewNumel != tensorNumel) return false;
      if (td > 0) {
        chunkBase = oldStrides[td - 1];
        tensorNumel = 1;
        viewNumel = 1;
      }
    }
  }
  return viewD == -1;
}
}  // namespace

Tensor viewRaw(const Tensor& x, const Shape& shape) {
  Shape s = inferShape(shape, x.numel(), x.shape());
  if (x.isContiguous() || x.numel() == 0) return withGeometry(x, s, contiguousStrides(s), x.storageOffset());
  std::vector<int64_t> strides;
  if (!viewStrides(x.shape(), x.strides(), s, strides))
    KOLO_THROW(InvalidArgument, "view: shape ", shapeString(x.shape()), " with strides ",
               shapeString(x.strides()), " cannot be viewed as ", shapeString(s),
               "; use reshape (which copies)");
  return withGeometry(x, s, strides, x.storageOffset());
}

Tensor reshapeRaw(const Tensor& x, const Shape& shape) {
  Shape s = inferShape(shape, x.numel(), x.shape());
  if (x.isContiguous() || x.numel() == 0) return withGeometry(x, s, contiguousStrides(s), x.storageOffset());
  std::vector<int64_t> strides;
  if (viewStrides(x.shape(), x.strides(), s, strides)) return withGeometry(x, s, strides, x.storageOffset());
  Tensor c = x.contiguous();
  return withGeometry(c, s, contiguousStrides(s), c.storageOffset());
}

Tensor transposeRaw(const Tensor& x, int64_t d0, int64_t d1) {
  const int64_t nd = x.dim();
  d0 = wrapDim(d0, nd, "transpose");
  d1 = wrapDim(d1, nd, "transpose");
  Shape shape = x.shape();
  std::vector<int64_t> strides = x.strides();
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return withGeometry(x, shape, strides, x.storageOffset());
}

Tensor permuteRaw(const Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t nd = x.dim();
  KOLO_CHECK_EQ(static_cast<int64_t>(dims.size()), nd, "permute of shape ", shapeString(x.shape()));
  Shape shape(nd);
  std::vector<int64_t> strides(nd);
  std::vector<bool> seen(nd, false);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t d = wrapDim(dims[i], nd, "permute");
    KOLO_CHECK(!seen[d], "permute: dimension ", d, " repeated");
    seen[d] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  return withGeometry(x, shape, strides, x.storageOffset());
}

Tensor sliceRaw(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrapDim(dim, x.dim(), "slice");
  KOLO_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = x.shape()[dim];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = x.shape();
  std::vector<int64_t> strides = x.strides();
  shape[dim] = (end - start + step - 1) / step;
  const int64_t offset = x.storageOffset() + start * strides[dim];
  strides[dim] *= step;
  return withGeometry(x, shape, strides, offset);
}

Tensor expandRaw(const Tensor& x, const Shape& shape) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t xd = x.dim();
  KOLO_CHECK(nd >= xd, "expand ", shapeString(x.shape()), " to fewer dimensions ", shapeString(shape));
  Shape out(nd);
  std::vector<int64_t> strides(nd, 0);
  for (int64_t i = nd - 1; i >= 0; --i) {
    const int64_t j = i - (nd - xd);
    const int64_t target = shape[i];
    if (j < 0) {
      KOLO_CHECK(target >= 0, "expand: -1 not allowed for a new leading dimension");
      out[i] = target;
      continue;
    }
    const int64_t have = x.shape()[j];
    if (target == -1 || target == have) {
      out[i] = have;
      strides[i] = x.strides()[j];
    } else if (have == 1) {
      out[i] = target;
    } else {
      KOLO_THROW(InvalidArgument, "cannot expand shape ", shapeString(x.shape()), " to ", shapeString(shape));
    }
  }
  return withGeometry(x, out, strides, x.storageOffset());
}

Tensor unsqueezeRaw(const Tensor& x, int64_t dim) {
  const int64_t nd = x.dim() + 1;
  dim = wrapDim(dim, nd, "unsqueeze");
  Shape shape = x.shape();
  std::vector<int64_t> strides = x.strides();
  const int64_t st = dim < x.dim() ? shape[dim] * strides[dim] : 1;
  shape.insert(shape.begin() + dim, 1);
  strides.insert(strides.begin() + dim, st);
  return withGeometry(x, shape, strides, x.storageOffset());
}

Tensor squeezeRaw(const Tensor& x, int64_t dim) {
  dim = wrapDim(dim, x.dim(), "squeeze");
  if (x.shape()[dim] != 1) return withGeometry(x, x.shape(), x.strides(), x.storageOffset());
  Shape shape = x.shape();
  std::vector<int64_t> strides = x.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return withGeometry(x, shape, strides, x.storageOffset());
}

}  // namespace kolo::kernels
