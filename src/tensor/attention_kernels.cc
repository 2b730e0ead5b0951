// Fused causal multi-head attention over packed projections qkv (B, T, 3C), by blocks as
// flash attention goes, on the CPU: per (batch, head), query rows in blocks (of 16 or 32) meet
// only the keys up to their block's last row (the upper triangle beyond the diagonal block is
// never computed): S = Q K^T / sqrt(hd) by GEMM on strided views of qkv into a block x T
// buffer, a causal softmax over each row's prefix, and Y = P V straight into the head's
// columns of (B, T, C). The caller chooses whether P is kept: with it, backward reads each
// block's P; without it, nothing T x T is kept and backward recomputes P from the saved row
// log-sum-exp (one GEMM and one exponential per score more). Backward fills a head's dS (and P,
// when recomputed) query block by query block, then takes dK and dV by blocks of keys, each
// one product over every later query. No mask tensor; a head's K (and V in backward) is copied
// transposed once, T x hd elements, so that every product runs along keys; the next head's
// operands are fetched into the cache while a head's products run.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/gemm.h"
#include "tensor/kernels.h"
#include "tensor/row_kernels.h"
#include "tensor/transpose.h"

namespace kolo::kernels {

namespace {

// Query rows per block: smaller blocks skip more of the upper triangle, larger ones make
// longer products. Measured per layer (one thread, f32, P kept): T 64, hd 32 (the default
// lm): forward 0.37 / 0.45 ms and backward 0.53 / 0.60 ms with blocks of 16 / 32; T 128, hd 64
// (the 10.9 M size): forward 2.20 / 2.10 ms and backward 3.78 / 3.51 ms.
int64_t queryBlock(int64_t t) { return t <= 64 ? 16 : 32; }

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

// S (rows x keys, row stride ld) of query block r0 -> P in place: row i's first r0 + i + 1
// entries e^(s - lse) with lse its log-sum-exp (written to lse[i] when `fromLse` is false,
// read from it when true), the rest of the row 0 (detail::causalSoftmaxRows for f32).
template <class T>
void causalSoftmaxBlock(T* sp, int64_t ld, int64_t rows, int64_t keys, int64_t r0, T* lse, bool fromLse) {
  if constexpr (std::is_same_v<T, float>) {
    detail::causalSoftmaxRows(sp, ld, rows, keys, r0, lse, fromLse);
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      T* row = sp + i * ld;
      std::fill(row + r0 + i + 1, row + keys, T(0));
      const int64_t visible = r0 + i + 1;
      T shift = fromLse ? lse[i] : *std::max_element(row, row + visible);
      T total = 0;
      for (int64_t j = 0; j < visible; ++j) total += row[j] = std::exp(row[j] - shift);
      if (fromLse) continue;
      const T inv = T(1) / total;
      for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
      lse[i] = shift + std::log(total);
    }
  }
}

// to (cols x rows, row stride rows) = from (rows x cols, row stride ld) transposed: a head's
// keys or values as K^T, so that S = Q K^T and dP = dY V^T are plain products whose columns
// are keys (the GEMM kernels' fast direction) rather than products with B transposed.
template <class T>
void transposeHead(const T* from, int64_t ld, int64_t rows, int64_t cols, T* to) {
  if constexpr (std::is_same_v<T, float>) {
    detail::transposeF32(rows, cols, from, ld, to, rows);
  } else {
    for (int64_t d = 0; d < cols; ++d)
      for (int64_t i = 0; i < rows; ++i) to[d * rows + i] = from[i * ld + d];
  }
}

// Asks for `rows` rows of `bytes` bytes each (row stride ld elements) to be brought into the
// cache (`write` for lines about to be written): the next head's operands, fetched while the
// current head's products run.
template <class T>
void prefetchRows(const T* from, int64_t ld, int64_t rows, int64_t bytes, bool write = false) {
  for (int64_t i = 0; i < rows; ++i) {
    const char* row = reinterpret_cast<const char*>(from + i * ld);
    for (int64_t at = 0; at < bytes; at += 64) {
      if (write) __builtin_prefetch(row + at, 1, 2);
      else __builtin_prefetch(row + at, 0, 2);
    }
  }
}

// The head after (b, h) in the loops' order (heads inside batches) as (nb, nh); false for the
// last.
bool nextHead(const AttentionSizes& s, int64_t b, int64_t h, int64_t* nb, int64_t* nh) {
  if (b * s.h + h + 1 >= s.b * s.h) return false;
  *nb = h + 1 < s.h ? b : b + 1;
  *nh = h + 1 < s.h ? h + 1 : 0;
  return true;
}

}  // namespace

Tensor causalAttentionForward(const Tensor& qkv0, int64_t heads, Tensor* logSumExp, Tensor* probabilities) {
  const AttentionSizes s = attentionSizes(qkv0, heads);
  Tensor qkv = qkv0.contiguous();
  Tensor y = Tensor::empty({s.b, s.t, s.c}, qkv.dtype());
  Tensor lse = Tensor::empty({s.b, s.h, s.t}, qkv.dtype());
  Tensor kept = probabilities ? Tensor::empty({s.b, s.h, s.t, s.t}, qkv.dtype()) : Tensor();
  detail::dispatchFloat(qkv.dtype(), "causal attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.hd)));
    const int64_t ld = 3 * s.c;
    const int64_t qb = queryBlock(s.t);
    std::vector<T> block(static_cast<size_t>(qb * s.t));  // (qb, T): S, then P
    std::vector<T> kt(static_cast<size_t>(s.hd * s.t));        // (hd, T): K^T of the head
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        const T* q = qkv.data<T>() + b * s.t * ld + h * s.hd;  // (T, hd), row stride 3C
        const T* k = q + s.c;
        const T* v = q + 2 * s.c;
        T* yb = y.data<T>() + b * s.t * s.c + h * s.hd;  // (T, hd), row stride C
        T* lseb = lse.data<T>() + (b * s.h + h) * s.t;
        // (T, T) of the head when P is kept: each block's S and P go straight there.
        T* pb = kept.defined() ? kept.data<T>() + (b * s.h + h) * s.t * s.t : nullptr;
        if (int64_t nb, nh; nextHead(s, b, h, &nb, &nh)) {
          const T* nq = qkv.data<T>() + nb * s.t * ld + nh * s.hd;
          for (int part = 0; part < 3; ++part) prefetchRows(nq + part * s.c, ld, s.t, s.hd * sizeof(T));
          prefetchRows(y.data<T>() + nb * s.t * s.c + nh * s.hd, s.c, s.t, s.hd * sizeof(T), true);
        }
        transposeHead(k, ld, s.t, s.hd, kt.data());
        for (int64_t r0 = 0; r0 < s.t; r0 += qb) {
          const int64_t rows = std::min(qb, s.t - r0), keys = r0 + rows;
          T* sp = pb ? pb + r0 * s.t : block.data();
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, keys, s.hd, scale, q + r0 * ld, ld, kt.data(), s.t,
                          T(0), sp, s.t);
          causalSoftmaxBlock(sp, s.t, rows, keys, r0, lseb + r0, false);
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, s.hd, keys, T(1), sp, s.t, v, ld, T(0), yb + r0 * s.c,
                          s.c);
        }
      }
  });
  if (logSumExp) *logSumExp = lse;
  if (probabilities) *probabilities = kept;
  return y;
}

Tensor causalAttentionBackward(const Tensor& grad0, const Tensor& qkv0, const Tensor& logSumExp, int64_t heads,
                               const Tensor& probabilities) {
  const AttentionSizes s = attentionSizes(qkv0, heads);
  KOLO_CHECK(grad0.shape() == (Shape{s.b, s.t, s.c}) && logSumExp.shape() == (Shape{s.b, s.h, s.t}),
             "causal attention backward: gradient ", shapeString(grad0.shape()), " and log-sum-exp ",
             shapeString(logSumExp.shape()), " do not match qkv ", shapeString(qkv0.shape()));
  KOLO_CHECK(!probabilities.defined() || probabilities.shape() == (Shape{s.b, s.h, s.t, s.t}),
             "causal attention backward: probabilities ", shapeString(probabilities.shape()), " do not match qkv ",
             shapeString(qkv0.shape()));
  Tensor qkv = qkv0.contiguous(), grad = grad0.contiguous(), lse = logSumExp.contiguous();
  Tensor kept = probabilities.defined() ? probabilities.contiguous() : Tensor();
  Tensor out = Tensor::empty(qkv.shape(), qkv.dtype());
  detail::dispatchFloat(qkv.dtype(), "causal attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.hd)));
    const int64_t ld = 3 * s.c;
    const int64_t qb = queryBlock(s.t);
    // The head's P (when not kept) and dS, (T, T) each: the query blocks fill their rows up
    // to their last key, and dK, dV are then taken by key blocks over every later query.
    std::vector<T> p(static_cast<size_t>(s.t * s.t)), ds(p.size());
    std::vector<T> kt(static_cast<size_t>(s.hd * s.t)), vt(kt.size());  // (hd, T): K^T, V^T
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t at = b * s.t * ld + h * s.hd;
        const T* q = qkv.data<T>() + at;
        T* dq = out.data<T>() + at;
        T* dk = dq + s.c;
        T* dv = dq + 2 * s.c;
        const T* gy = grad.data<T>() + b * s.t * s.c + h * s.hd;  // (T, hd), row stride C
        T* lseb = lse.data<T>() + (b * s.h + h) * s.t;
        const T* pb = kept.defined() ? kept.data<T>() + (b * s.h + h) * s.t * s.t : nullptr;
        // The next head's rows [i0, i0 + n), fetched a query block at a time.
        int64_t nb = 0, nh = 0;
        const bool more = nextHead(s, b, h, &nb, &nh);
        const auto fetchNext = [&, nat = nb * s.t * ld + nh * s.hd](int64_t i0, int64_t n) {
          if (!more) return;
          for (int part = 0; part < 3; ++part) {
            prefetchRows(qkv.data<T>() + nat + part * s.c + i0 * ld, ld, n, s.hd * sizeof(T));
            prefetchRows(out.data<T>() + nat + part * s.c + i0 * ld, ld, n, s.hd * sizeof(T), true);
          }
          prefetchRows(grad.data<T>() + (nb * s.t + i0) * s.c + nh * s.hd, s.c, n, s.hd * sizeof(T));
          if (pb) prefetchRows(pb + s.t * s.t + i0 * s.t, s.t, n, s.t * sizeof(T));
        };
        if (!pb) transposeHead(q + s.c, ld, s.t, s.hd, kt.data());  // only to recompute S
        transposeHead(q + 2 * s.c, ld, s.t, s.hd, vt.data());
        const T* ph = pb ? pb : p.data();
        for (int64_t r0 = 0; r0 < s.t; r0 += qb) {
          const int64_t rows = std::min(qb, s.t - r0), keys = r0 + rows;
          fetchNext(r0, rows);
          // P of the block: kept by the forward, or again from the saved log-sum-exp.
          if (!pb) {
            detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, keys, s.hd, scale, q + r0 * ld, ld, kt.data(), s.t,
                            T(0), p.data() + r0 * s.t, s.t);
            causalSoftmaxBlock(p.data() + r0 * s.t, s.t, rows, keys, r0, lseb + r0, true);
          }
          const T* pr = ph + r0 * s.t;
          T* dsr = ds.data() + r0 * s.t;
          // dP = dY_r V^T; dS = P (dP - rowsum(P dP)) / sqrt(hd), the row sum taken over the P
          // in hand (as PyTorch's softmax backward does) rather than as the equal dY . Y: the
          // key third of the qkv bias, whose true gradient is zero, then gets the rounding of
          // P's row sums only; dQ_r = dS K.
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, keys, s.hd, T(1), gy + r0 * s.c, s.c, vt.data(), s.t,
                          T(0), dsr, s.t);
          if constexpr (std::is_same_v<T, float>) {
            detail::softmaxBackwardRows(pr, s.t, dsr, s.t, rows, keys, scale);
          } else {
            for (int64_t i = 0; i < rows; ++i) {
              const T* prow = pr + i * s.t;
              T* row = dsr + i * s.t;
              T dot = 0;
              for (int64_t j = 0; j < keys; ++j) dot += prow[j] * row[j];
              for (int64_t j = 0; j < keys; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
            }
          }
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, s.hd, keys, T(1), dsr, s.t, q + s.c, ld, T(0),
                          dq + r0 * ld, ld);
        }
        // Keys k0.. of a block are seen by the queries from k0 on, whose rows of P and dS the
        // loop above filled up to this block's last key: dV_k = P^T dY and dK_k = dS^T Q over
        // those queries, one product each.
        for (int64_t k0 = 0; k0 < s.t; k0 += qb) {
          const int64_t cols = std::min(qb, s.t - k0), queries = s.t - k0;
          detail::gemm<T>(CblasTrans, CblasNoTrans, cols, s.hd, queries, T(1), ph + k0 * s.t + k0, s.t,
                          gy + k0 * s.c, s.c, T(0), dv + k0 * ld, ld);
          detail::gemm<T>(CblasTrans, CblasNoTrans, cols, s.hd, queries, T(1), ds.data() + k0 * s.t + k0, s.t,
                          q + k0 * ld, ld, T(0), dk + k0 * ld, ld);
        }
      }
  });
  return out;
}

}  // namespace kolo::kernels
