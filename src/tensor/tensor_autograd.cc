// Tensor's autograd members (requiresGrad, grad, backward, hooks) and its view methods,
// which record a backward node when the source requires grad. Recording and running a
// backward pass are the autograd layer's; it registers them here (autograd_hooks.h).
#include <numeric>

#include "tensor/autograd_hooks.h"
#include "tensor/kernels.h"

namespace kolo {

using autograd::AutogradMeta;

namespace detail {
namespace {
// Constant-initialised, so it is set before any dynamic initialiser can register hooks.
AutogradHooks gHooks;
}  // namespace

void registerAutogradHooks(const AutogradHooks& hooks) { gHooks = hooks; }

const AutogradHooks& autogradHooks(const Tensor& forTensor) {
  if (!gHooks.record || !gHooks.backward)
    KOLO_THROW(Error, "tensor '", forTensor.name(), "' of shape ", shapeString(forTensor.shape()),
               " requires grad, but kolo's autograd layer is not linked (link kolo::autograd, or "
               "kolo::kolo)");
  return gHooks;
}
}  // namespace detail

namespace {
/// Records `out`, a view of `self`, which requires grad (record() checks grad mode).
Tensor recordView(Tensor out, const Tensor& self, const char* name,
                  std::function<std::vector<Tensor>(const Tensor&)> backward) {
  return detail::autogradHooks(self).record(std::move(out), {self}, name, std::move(backward));
}
}  // namespace

bool Tensor::requiresGrad() const {
  return impl_ && impl_->autograd && impl_->autograd->requiresGrad;
}

Tensor& Tensor::setRequiresGrad(bool enabled) {
  KOLO_CHECK(defined(), "setRequiresGrad on an undefined tensor");
  if (enabled) {
    KOLO_CHECK(dtype() == DType::F32 || dtype() == DType::F64,
               "only f32/f64 tensors can require grad, '", name(), "' is ", dtypeName(dtype()));
    KOLO_CHECK(isLeaf(), "setRequiresGrad on a non-leaf tensor; use detach() first");
  }
  if (!impl_->autograd) {
    if (!enabled) return *this;
    impl_->autograd = std::make_shared<AutogradMeta>();
  }
  impl_->autograd->requiresGrad = enabled;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl_ || !impl_->autograd) return Tensor();
  AutogradMeta& meta = *impl_->autograd;
  if (meta.gradIsZero) {
    meta.grad.fill(0.0);
    meta.gradIsZero = false;
  }
  return meta.grad;
}

void Tensor::setGrad(const Tensor& grad) {
  KOLO_CHECK(defined(), "setGrad on an undefined tensor");
  if (grad.defined())
    KOLO_CHECK(grad.shape() == shape(), "setGrad: gradient shape ", shapeString(grad.shape()),
               " differs from tensor shape ", shapeString(shape()), " ('", name(), "')");
  if (!impl_->autograd) impl_->autograd = std::make_shared<AutogradMeta>();
  impl_->autograd->grad = grad;
  impl_->autograd->gradIsZero = false;
}

void Tensor::zeroGrad() {
  if (!impl_ || !impl_->autograd || !impl_->autograd->grad.defined()) return;
  impl_->autograd->gradIsZero = true;
}

void Tensor::backward(const Tensor& gradOutput) const {
  KOLO_CHECK(defined(), "backward() on an undefined tensor");
  detail::autogradHooks(*this).backward(*this, gradOutput);
}

Tensor Tensor::detach() const {
  KOLO_CHECK(defined(), "detach on an undefined tensor");
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->autograd.reset();
  return Tensor(std::move(impl));
}

bool Tensor::isLeaf() const { return !impl_ || !impl_->autograd || !impl_->autograd->gradFn; }

int Tensor::addGradReadyHook(std::function<void(Tensor&)> hook) {
  KOLO_CHECK(requiresGrad() && isLeaf(), "addGradReadyHook needs a leaf that requires grad ('",
             name(), "')");
  AutogradMeta& meta = *impl_->autograd;
  const int id = meta.nextHookId++;
  meta.hooks.emplace(id, std::move(hook));
  return id;
}

void Tensor::removeGradReadyHook(int id) {
  if (impl_ && impl_->autograd) impl_->autograd->hooks.erase(id);
}

// ---------------------------------------------------------------- views

Tensor Tensor::reshape(const Shape& shape) const {
  Tensor out = kernels::reshapeRaw(*this, shape);
  if (!requiresGrad()) return out;
  Shape in = this->shape();
  return recordView(out, *this, "ReshapeBackward",
                    [in](const Tensor& g) { return std::vector<Tensor>{g.reshape(in)}; });
}

Tensor Tensor::view(const Shape& shape) const {
  Tensor out = kernels::viewRaw(*this, shape);
  if (!requiresGrad()) return out;
  Shape in = this->shape();
  return recordView(out, *this, "ViewBackward",
                    [in](const Tensor& g) { return std::vector<Tensor>{g.reshape(in)}; });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Tensor out = kernels::transposeRaw(*this, d0, d1);
  if (!requiresGrad()) return out;
  return recordView(out, *this, "TransposeBackward",
                    [d0, d1](const Tensor& g) { return std::vector<Tensor>{g.transpose(d0, d1)}; });
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  Tensor out = kernels::permuteRaw(*this, dims);
  if (!requiresGrad()) return out;
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[kernels::wrapDim(dims[i], static_cast<int64_t>(dims.size()), "permute")] =
        static_cast<int64_t>(i);
  return recordView(out, *this, "PermuteBackward",
                    [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  Tensor out = kernels::sliceRaw(*this, d, start, end, step);
  if (!requiresGrad()) return out;
  Shape in = this->shape();
  return recordView(out, *this, "SliceBackward", [=](const Tensor& g) {
    Tensor full = Tensor::zeros(in, g.dtype());
    Tensor region = kernels::sliceRaw(full, d, start, end, step);
    kernels::copyInto(region, g);
    return std::vector<Tensor>{full};
  });
}

Tensor Tensor::expand(const Shape& shape) const {
  Tensor out = kernels::expandRaw(*this, shape);
  if (!requiresGrad()) return out;
  Shape in = this->shape();
  return recordView(out, *this, "ExpandBackward", [in](const Tensor& g) {
    return std::vector<Tensor>{kernels::sumToShape(g, in)};
  });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  Tensor out = kernels::unsqueezeRaw(*this, d);
  if (!requiresGrad()) return out;
  Shape in = this->shape();
  return recordView(out, *this, "UnsqueezeBackward",
                    [in](const Tensor& g) { return std::vector<Tensor>{g.reshape(in)}; });
}

Tensor Tensor::squeeze(int64_t d) const {
  Tensor out = kernels::squeezeRaw(*this, d);
  if (!requiresGrad()) return out;
  Shape in = this->shape();
  return recordView(out, *this, "SqueezeBackward",
                    [in](const Tensor& g) { return std::vector<Tensor>{g.reshape(in)}; });
}

Tensor Tensor::flatten(int64_t startDim, int64_t endDim) const {
  const int64_t nd = dim();
  if (nd == 0) return reshape({1});
  startDim = kernels::wrapDim(startDim, nd, "flatten");
  endDim = kernels::wrapDim(endDim, nd, "flatten");
  KOLO_CHECK(startDim <= endDim, "flatten: startDim ", startDim, " after endDim ", endDim);
  Shape s;
  for (int64_t i = 0; i < startDim; ++i) s.push_back(shape()[i]);
  int64_t merged = 1;
  for (int64_t i = startDim; i <= endDim; ++i) merged *= shape()[i];
  s.push_back(merged);
  for (int64_t i = endDim + 1; i < nd; ++i) s.push_back(shape()[i]);
  return reshape(s);
}

}  // namespace kolo
