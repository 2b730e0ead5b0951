// Fused causal multi-head attention over packed projections qkv (B, T, 3C): per (batch,
// head) block, S = Q K^T / sqrt(hd) by GEMM on strided views of qkv, a softmax over each
// row's first t+1 scores (no mask tensor: the positions after t are never read), and Y = P V
// written straight into its head's columns of (B, T, C). No head transposes or copies. The
// rows go in blocks of kRowBlock, each multiplying only the keys up to its last row, so the
// GEMMs skip most of the zero upper triangle (3/4 of the full work at T = 64, 5/8 at 128).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/gemm.h"
#include "tensor/kernels.h"
#include "tensor/row_kernels.h"

namespace kolo::kernels {

namespace {

constexpr int64_t kRowBlock = 32;

struct AttentionSizes {
  int64_t b, t, c, h, hd;
};

AttentionSizes attentionSizes(const Tensor& qkv, int64_t heads) {
  KOLO_CHECK(qkv.dim() == 3 && qkv.shape()[2] % 3 == 0, "causal attention: qkv ", shapeString(qkv.shape()),
             " is not (B, T, 3C)");
  const int64_t c = qkv.shape()[2] / 3;
  KOLO_CHECK(heads > 0 && c % heads == 0, "causal attention: ", heads, " heads do not divide C = ", c);
  return {qkv.shape()[0], qkv.shape()[1], c, heads, c / heads};
}

// Row i of a (T, T) score block -> its causal softmax in place: entries 0..i normalised,
// the rest 0.
template <class T>
void causalSoftmaxRow(T* row, int64_t i, int64_t t) {
  if constexpr (std::is_same_v<T, float>) {
    detail::softmaxRows(row, row, 1, i + 1, false);
  } else {
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
    T total = 0;
    for (int64_t j = 0; j <= i; ++j) total += row[j] = std::exp(row[j] - mx);
    for (int64_t j = 0; j <= i; ++j) row[j] /= total;
  }
  for (int64_t j = i + 1; j < t; ++j) row[j] = T(0);
}

}  // namespace

Tensor causalAttentionForward(const Tensor& qkv0, int64_t heads, Tensor* probs) {
  const AttentionSizes s = attentionSizes(qkv0, heads);
  Tensor qkv = qkv0.contiguous();
  Tensor y = Tensor::empty({s.b, s.t, s.c}, qkv.dtype());
  Tensor p = Tensor::empty({s.b, s.h, s.t, s.t}, qkv.dtype());
  detail::dispatchFloat(qkv.dtype(), "causal attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.hd)));
    const int64_t ld = 3 * s.c;
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        const T* q = qkv.data<T>() + b * s.t * ld + h * s.hd;  // (T, hd), row stride 3C
        const T* k = q + s.c;
        const T* v = q + 2 * s.c;
        T* pb = p.data<T>() + (b * s.h + h) * s.t * s.t;  // (T, T)
        T* yb = y.data<T>() + b * s.t * s.c + h * s.hd;
        for (int64_t r0 = 0; r0 < s.t; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, s.t - r0), keys = r0 + rows;
          T* prow = pb + r0 * s.t;
          detail::gemm<T>(CblasNoTrans, CblasTrans, rows, keys, s.hd, scale, q + r0 * ld, ld, k, ld, T(0), prow, s.t);
          for (int64_t i = r0; i < r0 + rows; ++i) causalSoftmaxRow(pb + i * s.t, i, s.t);
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, s.hd, keys, T(1), prow, s.t, v, ld, T(0), yb + r0 * s.c,
                          s.c);
        }
      }
  });
  if (probs) *probs = p;
  return y;
}

Tensor causalAttentionBackward(const Tensor& grad0, const Tensor& qkv0, const Tensor& probs, int64_t heads) {
  const AttentionSizes s = attentionSizes(qkv0, heads);
  KOLO_CHECK(grad0.shape() == (Shape{s.b, s.t, s.c}) && probs.shape() == (Shape{s.b, s.h, s.t, s.t}),
             "causal attention backward: gradient ", shapeString(grad0.shape()), " and probabilities ",
             shapeString(probs.shape()), " do not match qkv ", shapeString(qkv0.shape()));
  Tensor qkv = qkv0.contiguous(), grad = grad0.contiguous(), pc = probs.contiguous();
  Tensor out = Tensor::empty(qkv.shape(), qkv.dtype());
  detail::dispatchFloat(qkv.dtype(), "causal attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.hd)));
    const int64_t ld = 3 * s.c;
    std::vector<T> ds(static_cast<size_t>(s.t * s.t));  // dP, then dS, of one block
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t at = b * s.t * ld + h * s.hd;
        const T* q = qkv.data<T>() + at;
        const T* k = q + s.c;
        const T* v = q + 2 * s.c;
        T* dq = out.data<T>() + at;
        T* dk = dq + s.c;
        T* dv = dq + 2 * s.c;
        const T* gy = grad.data<T>() + b * s.t * s.c + h * s.hd;  // (T, hd), row stride C
        const T* pb = pc.data<T>() + (b * s.h + h) * s.t * s.t;
        // dV = P^T dY and dK = dS^T Q by key block (only rows at or after the block's first
        // key contribute); dP = dY V^T, dS = P (dP - rowsum(P dP)) / sqrt(hd) and dQ = dS K by
        // row block (only keys up to the block's last row). P and dS are 0 above the diagonal.
        for (int64_t r0 = 0; r0 < s.t; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, s.t - r0), keys = r0 + rows;
          T* dsRows = ds.data() + r0 * s.t;
          detail::gemm<T>(CblasNoTrans, CblasTrans, rows, keys, s.hd, T(1), gy + r0 * s.c, s.c, v, ld, T(0), dsRows,
                          s.t);
          for (int64_t i = r0; i < r0 + rows; ++i) {
            T* row = ds.data() + i * s.t;
            const T* prow = pb + i * s.t;
            T dot = 0;
            for (int64_t j = 0; j <= i; ++j) dot += prow[j] * row[j];
            for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
            for (int64_t j = i + 1; j < keys; ++j) row[j] = T(0);
          }
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, s.hd, keys, T(1), dsRows, s.t, k, ld, T(0), dq + r0 * ld,
                          ld);
        }
        for (int64_t c0 = 0; c0 < s.t; c0 += kRowBlock) {
          const int64_t cols = std::min(kRowBlock, s.t - c0), depth = s.t - c0;
          detail::gemm<T>(CblasTrans, CblasNoTrans, cols, s.hd, depth, T(1), pb + c0 * s.t + c0, s.t, gy + c0 * s.c,
                          s.c, T(0), dv + c0 * ld, ld);
          detail::gemm<T>(CblasTrans, CblasNoTrans, cols, s.hd, depth, T(1), ds.data() + c0 * s.t + c0, s.t,
                          q + c0 * ld, ld, T(0), dk + c0 * ld, ld);
        }
      }
  });
  return out;
}

}  // namespace kolo::kernels
