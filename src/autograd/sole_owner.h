// Internal: whether a gradient buffer may be written in place, for the engine's sums and the
// backward functions that overwrite their incoming gradient.
#pragma once

#include "kolo/tensor.h"

namespace kolo::autograd {

/// True when `t` is the only handle on its elements, so that writing them changes nothing
/// another tensor can see: one Tensor on the impl, one impl on the storage, one storage on
/// the bytes, no autograd slot, contiguous. The engine hands each node its incoming gradient
/// as the sole reference.
inline bool solelyOwned(const Tensor& t) {
  const TensorImpl* impl = t.impl();
  return impl && t.implPtr().use_count() == 1 && impl->storage.use_count() == 1 &&
         impl->storage->bytes.use_count() == 1 && !impl->autograd && t.isContiguous();
}

}  // namespace kolo::autograd
