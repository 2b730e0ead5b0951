// Tensor memory accounting for the whole process: the bytes of tensor storage allocated and
// not yet freed, their peak, and an optional budget (`kolo train --memory-limit`) past which
// an allocation throws MemoryLimitError naming the tensor's shape and the bytes. Counts the
// storage Tensor::empty() allocates (every tensor the library makes), not other heap use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kolo/dtype.h"
#include "kolo/error.h"
#include "kolo/tensor.h"

namespace kolo {

/// An allocation would take tensor memory past the budget set with setTensorMemoryLimit()
/// (`--memory-limit`). A kind of InvalidArgument: the configuration asked for more than it
/// allowed itself (exit code 2 from the `kolo` command).
class MemoryLimitError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// Bytes of tensor storage alive in this process now (64-byte rounded allocations).
int64_t liveTensorBytes();
/// The most bytes alive at once since the process started or the last resetPeakTensorBytes().
int64_t peakTensorBytes();
/// Starts a new peak from the bytes alive now.
void resetPeakTensorBytes();
/// Sets the budget (bytes; 0: none). Allocations that would pass it throw MemoryLimitError;
/// what is alive already stays. Thread-safe.
void setTensorMemoryLimit(int64_t bytes);
int64_t tensorMemoryLimit();

/// Keeps the memory a process frees in its heap (glibc: no mmap() for large blocks, no trimming
/// of the heap's top) so that the next step reuses it. Training allocates and frees the same
/// large activation and im2col buffers every step; without this glibc returns them to the
/// kernel and every step page-faults them in again (a fifth of the CPU time of a cnn step).
/// Process-wide; train::fit, trainParameterServer and trainFederated call it, a training loop
/// of one's own may before its first step.
void keepFreedMemory();

namespace detail {
/// Tensor::empty's accounting: adds `bytes`, or throws MemoryLimitError (nothing added).
void chargeTensorBytes(size_t bytes, const Shape& shape, DType dtype);
void releaseTensorBytes(size_t bytes);
}  // namespace detail

}  // namespace kolo
