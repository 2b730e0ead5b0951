// kolo::Tensor: a reference-counted, strided view of typed storage, with the autograd slot.
// Copies of a Tensor share storage (as torch.Tensor does); clone() makes a deep copy.
// Differentiable operations on tensors are declared in kolo/ops.h (autograd layer); the
// raw kernels they call live in src/tensor and never record gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kolo/dtype.h"
#include "kolo/error.h"

namespace kolo {

using Shape = std::vector<int64_t>;

/// Number of elements of a shape (1 for a scalar shape {}).
int64_t shapeNumel(const Shape& shape);
/// "[2, 3, 4]".
std::string shapeString(const Shape& shape);
/// Row-major contiguous strides for a shape.
std::vector<int64_t> contiguousStrides(const Shape& shape);

/// Seeded pseudo-random generator (counter-free xoshiro256**, splitmix64 seeding).
/// Deterministic across platforms; its state can be saved and restored exactly.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0);
  uint64_t nextU64();
  /// Uniform in [0, 1).
  double uniform();
  /// Standard normal (Box-Muller).
  double normal();
  std::vector<uint64_t> state() const;
  void setState(const std::vector<uint64_t>& state);

 private:
  uint64_t s_[4];
};

namespace autograd {
class Node;           // a recorded operation (kolo/autograd.h)
struct AutogradMeta;  // below: grad, grad_fn, hooks
}  // namespace autograd

/// Raw storage owned by one or more tensors.
struct Storage {
  std::shared_ptr<uint8_t[]> bytes;
  size_t nbytes = 0;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  std::vector<int64_t> strides;  // in elements
  int64_t offset = 0;            // in elements
  DType dtype = DType::F32;
  std::shared_ptr<autograd::AutogradMeta> autograd;
  std::string name;  // optional, for error messages and parameter names
};

class Tensor {
 public:
  /// An undefined tensor (defined() == false).
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (results never require grad) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::F32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  static Tensor ones(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32);
  static Tensor scalar(double value, DType dtype = DType::F32);
  /// Copies `values` (converted to dtype) into a new tensor of `shape`; sizes must agree.
  static Tensor fromVector(const Shape& shape, const std::vector<float>& values, DType dtype = DType::F32);
  static Tensor fromVector(const Shape& shape, const std::vector<double>& values, DType dtype = DType::F64);
  static Tensor fromVector(const Shape& shape, const std::vector<int64_t>& values, DType dtype = DType::I64);
  static Tensor arange(int64_t n, DType dtype = DType::F32);
  /// Uniform in [low, high).
  static Tensor rand(const Shape& shape, Generator& gen, double low = 0.0, double high = 1.0, DType dtype = DType::F32);
  static Tensor randn(const Shape& shape, Generator& gen, double mean = 0.0, double stddev = 1.0, DType dtype = DType::F32);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const std::vector<int64_t>& strides() const;
  int64_t dim() const;
  /// Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const;
  int64_t storageOffset() const;
  size_t nbytes() const;  // numel * element size
  bool isContiguous() const;
  const std::string& name() const;
  void setName(const std::string& name);
  TensorImpl* impl() const { return impl_.get(); }
  /// The shared implementation handle (the autograd layer keeps weak references to leaves).
  const std::shared_ptr<TensorImpl>& implPtr() const { return impl_; }
  /// True when both handles refer to the same TensorImpl.
  bool sameAs(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- element access (throws InvalidArgument if T does not match dtype()) ----
  /// Pointer to the first element of this view (storage + offset); contiguous or not.
  template <class T> T* data();
  template <class T> const T* data() const;
  void* rawData();
  const void* rawData() const;
  /// The single element of a one-element tensor, converted to double.
  double item() const;
  /// Copies the elements (in logical row-major order) converted to float / double.
  std::vector<float> toFloatVector() const;
  std::vector<double> toDoubleVector() const;

  // ---- copies and conversions (not recorded by autograd) ----
  Tensor contiguous() const;  // returns *this when already contiguous
  Tensor clone() const;       // deep, contiguous copy; no grad history
  Tensor to(DType dtype) const;
  /// Copies src's elements into this tensor in place (shapes must match, dtypes converted).
  void copyFrom(const Tensor& src);
  void fill(double value);

  // ---- views (differentiable when recorded through autograd; see ops.h) ----
  Tensor reshape(const Shape& shape) const;  // view when possible, else copy; one -1 allowed
  Tensor view(const Shape& shape) const;     // must be viewable without copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t startDim = 0, int64_t endDim = -1) const;
  Tensor t() const { return transpose(0, 1); }

  // ---- autograd ----
  bool requiresGrad() const;
  /// Marks a leaf as requiring grad (parameters); returns *this.
  Tensor& setRequiresGrad(bool enabled = true);
  /// The accumulated gradient (undefined until a backward pass reaches this leaf).
  Tensor grad() const;
  void setGrad(const Tensor& grad);
  /// Sets the gradient to zero if defined (keeps its storage, as DDP buckets view it). The
  /// zeros are logical: the next backward overwrites the buffer instead of adding to it, and
  /// grad() fills the zeros if it is read first.
  void zeroGrad();
  /// Runs reverse-mode differentiation from this tensor. With no argument, this must hold
  /// one element and the seed gradient is 1.
  void backward(const Tensor& gradOutput = Tensor()) const;
  /// Same storage, no history, requiresGrad false.
  Tensor detach() const;
  bool isLeaf() const;
  /// Registers a hook that fires once per backward pass, as soon as this leaf's gradient
  /// for that pass is final (accumulated from every path). Returns a handle id.
  int addGradReadyHook(std::function<void(Tensor&)> hook);
  void removeGradReadyHook(int id);

  std::string toString(int64_t maxElements = 16) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

namespace autograd {

/// Autograd state of one tensor: requires-grad flag, accumulated gradient, the node that
/// produced it (null for leaves), the leaf's accumulator node and its gradient-ready hooks.
/// The tensor layer keeps this state; the autograd layer (kolo/autograd.h) makes the nodes.
struct AutogradMeta {
  bool requiresGrad = false;
  Tensor grad;
  // True after zeroGrad(): `grad` holds stale values that stand for zeros. The next
  // gradient overwrites instead of adding; Tensor::grad() fills the zeros on first read.
  bool gradIsZero = false;
  std::shared_ptr<Node> gradFn;
  std::shared_ptr<Node> accumulator;
  std::map<int, std::function<void(Tensor&)>> hooks;
  int nextHookId = 0;
};

}  // namespace autograd
}  // namespace kolo
