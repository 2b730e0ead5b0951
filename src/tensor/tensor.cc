// Tensor construction, metadata, element access, copies and dtype conversion.
// Everything here is raw (no gradient recording); views and autograd members of Tensor are
// defined in the autograd layer because they may record a backward node.
#include "kolo/tensor.h"

#include "kolo/memory.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "tensor/dispatch.h"
#include "tensor/kernels.h"

namespace kolo {

int64_t shapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shapeString(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::vector<int64_t> contiguousStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

// ---------------------------------------------------------------- factories

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t s : shape)
    KOLO_CHECK(s >= 0, "negative dimension in shape ", shapeString(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();
  const size_t nbytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  // 64-byte alignment keeps vector loads aligned and GEMM inputs cache-line friendly.
  const size_t alloc = nbytes == 0 ? 64 : (nbytes + 63) / 64 * 64;
  detail::chargeTensorBytes(alloc, shape, dtype);  // throws MemoryLimitError past the budget
  impl->storage->bytes = std::shared_ptr<uint8_t[]>(
      static_cast<uint8_t*>(::operator new[](alloc, std::align_val_t{64})), [alloc](uint8_t* p) {
        ::operator delete[](p, std::align_val_t{64});
        detail::releaseTensorBytes(alloc);
      });
  impl->storage->nbytes = nbytes;
  impl->shape = shape;
  impl->strides = contiguousStrides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.rawData(), 0, t.nbytes());
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

namespace {
template <class V>
Tensor fromValues(const Shape& shape, const std::vector<V>& values, DType dtype) {
  KOLO_CHECK_EQ(shapeNumel(shape), static_cast<int64_t>(values.size()), "fromVector: shape ",
                shapeString(shape), " does not hold the given number of values");
  Tensor t = Tensor::empty(shape, dtype);
  detail::dispatchAll(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) out[i] = detail::convertElement<T>(values[i]);
  });
  return t;
}
}  // namespace

Tensor Tensor::fromVector(const Shape& shape, const std::vector<float>& values, DType dtype) {
  return fromValues(shape, values, dtype);
}
Tensor Tensor::fromVector(const Shape& shape, const std::vector<double>& values, DType dtype) {
  return fromValues(shape, values, dtype);
}
Tensor Tensor::fromVector(const Shape& shape, const std::vector<int64_t>& values, DType dtype) {
  return fromValues(shape, values, dtype);
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
  return fromValues({n}, v, dtype);
}

Tensor Tensor::rand(const Shape& shape, Generator& gen, double low, double high, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (auto& x : v) x = low + (high - low) * gen.uniform();
  return fromValues(shape, v, dtype);
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, double mean, double stddev, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (auto& x : v) x = mean + stddev * gen.normal();
  return fromValues(shape, v, dtype);
}

// ---------------------------------------------------------------- metadata

#define KOLO_REQUIRE_DEFINED(what) \
  KOLO_CHECK(impl_ != nullptr, what, " called on an undefined tensor")

namespace {
// A tensor whose storage's bytes were taken back (fsdp's ZeRO-3 frees a unit's whole
// parameters outside the unit's forward) has nothing to read: name it rather than hand out a
// null pointer.
void requireMemory(const TensorImpl& impl) {
  if (impl.storage->bytes || shapeNumel(impl.shape) == 0) return;
  KOLO_THROW(InvalidArgument, "tensor ", impl.name.empty() ? "" : "'" + impl.name + "' ", "of shape ",
             shapeString(impl.shape), " has no memory: its storage was released (fsdp frees a unit's "
             "parameters outside the unit's forward; a model must call its children as (*child)(x), "
             "not child->forward(x), so that the hooks that gather them run)");
}
}  // namespace

const Shape& Tensor::shape() const {
  KOLO_REQUIRE_DEFINED("shape()");
  return impl_->shape;
}
const std::vector<int64_t>& Tensor::strides() const {
  KOLO_REQUIRE_DEFINED("strides()");
  return impl_->strides;
}
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t dd = d < 0 ? d + nd : d;
  KOLO_CHECK(dd >= 0 && dd < nd, "size(", d, ") out of range for shape ", shapeString(shape()));
  return impl_->shape[dd];
}
int64_t Tensor::numel() const { return shapeNumel(shape()); }
DType Tensor::dtype() const {
  KOLO_REQUIRE_DEFINED("dtype()");
  return impl_->dtype;
}
int64_t Tensor::storageOffset() const {
  KOLO_REQUIRE_DEFINED("storageOffset()");
  return impl_->offset;
}
size_t Tensor::nbytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype()); }
bool Tensor::isContiguous() const {
  KOLO_REQUIRE_DEFINED("isContiguous()");
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}
const std::string& Tensor::name() const {
  KOLO_REQUIRE_DEFINED("name()");
  return impl_->name;
}
void Tensor::setName(const std::string& name) {
  KOLO_REQUIRE_DEFINED("setName()");
  impl_->name = name;
}

// ---------------------------------------------------------------- element access

namespace {
template <class T> constexpr bool matchesDType(DType d) {
  if constexpr (std::is_same_v<T, float>) return d == DType::F32;
  if constexpr (std::is_same_v<T, double>) return d == DType::F64;
  if constexpr (std::is_same_v<T, int32_t>) return d == DType::I32;
  if constexpr (std::is_same_v<T, int64_t>) return d == DType::I64;
  if constexpr (std::is_same_v<T, uint8_t>) return d == DType::U8;
  if constexpr (std::is_same_v<T, uint16_t>) return d == DType::F16 || d == DType::BF16;
  return false;
}
template <class T> const char* typeLabel() {
  if constexpr (std::is_same_v<T, float>) return "float";
  if constexpr (std::is_same_v<T, double>) return "double";
  if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
  if constexpr (std::is_same_v<T, int64_t>) return "int64_t";
  if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
  return "uint16_t";
}
}  // namespace

template <class T>
T* Tensor::data() {
  KOLO_REQUIRE_DEFINED("data()");
  if (!matchesDType<T>(impl_->dtype))
    KOLO_THROW(InvalidArgument, "data<", typeLabel<T>(), ">() on a tensor of dtype ",
               dtypeName(impl_->dtype), (impl_->name.empty() ? "" : " ('" + impl_->name + "')"));
  requireMemory(*impl_);
  return reinterpret_cast<T*>(impl_->storage->bytes.get()) + impl_->offset;
}
template <class T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}
template float* Tensor::data<float>();
template double* Tensor::data<double>();
template int32_t* Tensor::data<int32_t>();
template int64_t* Tensor::data<int64_t>();
template uint8_t* Tensor::data<uint8_t>();
template uint16_t* Tensor::data<uint16_t>();
template const float* Tensor::data<float>() const;
template const double* Tensor::data<double>() const;
template const int32_t* Tensor::data<int32_t>() const;
template const int64_t* Tensor::data<int64_t>() const;
template const uint8_t* Tensor::data<uint8_t>() const;
template const uint16_t* Tensor::data<uint16_t>() const;

void* Tensor::rawData() {
  KOLO_REQUIRE_DEFINED("rawData()");
  requireMemory(*impl_);
  return impl_->storage->bytes.get() + impl_->offset * static_cast<int64_t>(dtypeSize(impl_->dtype));
}
const void* Tensor::rawData() const { return const_cast<Tensor*>(this)->rawData(); }

double Tensor::item() const {
  KOLO_CHECK_EQ(numel(), 1, "item() needs a one-element tensor, got shape ", shapeString(shape()));
  return detail::dispatchAll(dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return detail::toDouble(*static_cast<const T*>(rawData()));
  });
}

std::vector<float> Tensor::toFloatVector() const {
  Tensor c = to(DType::F32);
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

std::vector<double> Tensor::toDoubleVector() const {
  Tensor c = to(DType::F64);
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

// ---------------------------------------------------------------- copies

Tensor Tensor::contiguous() const {
  if (isContiguous()) return *this;
  Tensor out = empty(shape(), dtype());
  kernels::copyInto(out, *this);
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype());
  kernels::copyInto(out, *this);
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype() && isContiguous()) {
    // to() always returns an independent tensor only when a conversion is needed, as in
    // PyTorch; same-dtype contiguous tensors are returned as is.
    return *this;
  }
  Tensor out = empty(shape(), target);
  kernels::copyInto(out, *this);
  return out;
}

void Tensor::copyFrom(const Tensor& src) {
  KOLO_CHECK(shape() == src.shape(), "copyFrom: destination shape ", shapeString(shape()),
             " differs from source shape ", shapeString(src.shape()));
  kernels::copyInto(*this, src);
}

void Tensor::fill(double value) {
  detail::dispatchAll(dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = detail::convertElement<T>(value);
    T* base = static_cast<T*>(rawData());
    std::array<const int64_t*, 1> st{impl_->strides.data()};
    detail::stridedRows<1>(impl_->shape, st, {0}, [&](auto off, int64_t n, auto inner) {
      T* p = base + off[0];
      for (int64_t i = 0; i < n; ++i) p[i * inner[0]] = v;
    });
  });
}

std::string Tensor::toString(int64_t maxElements) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(" << dtypeName(dtype()) << " " << shapeString(shape());
  if (!name().empty()) out << " '" << name() << "'";
  out << ": ";
  std::vector<double> v = toDoubleVector();
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()) && i < maxElements; ++i)
    out << (i ? ", " : "") << v[i];
  if (static_cast<int64_t>(v.size()) > maxElements) out << ", ...";
  out << ")";
  return out.str();
}

// ---------------------------------------------------------------- generator

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Generator::Generator(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Generator::nextU64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Generator::uniform() { return static_cast<double>(nextU64() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  // Box-Muller; one normal per call keeps the state a pure function of the call count.
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

std::vector<uint64_t> Generator::state() const { return {s_[0], s_[1], s_[2], s_[3]}; }

void Generator::setState(const std::vector<uint64_t>& state) {
  KOLO_CHECK_EQ(state.size(), size_t{4}, "Generator::setState needs 4 words");
  for (int i = 0; i < 4; ++i) s_[i] = state[i];
}

}  // namespace kolo
