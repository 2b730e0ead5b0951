// Fused causal multi-head attention, by blocks as flash attention goes, on the CPU, over
// packed projections qkv (B, T, 3C) or over separate q (B, T, Hq*d), k and v (B, T, Hkv*d)
// with grouped key/value heads (each serving Hq/Hkv query heads: its K^T made once for the
// group, its dK and dV the sums over the group). Per (batch, head), query rows in blocks (of
// 16 or 32) meet only the keys up to their block's last row (the upper triangle beyond the
// diagonal block is never computed): S = Q K^T / sqrt(hd) by GEMM on strided views of the
// projections into a block x T buffer, a causal softmax over each row's prefix, and Y = P V
// straight into the head's columns of the output. The caller chooses whether P is kept: with
// it, backward reads each block's P; without it, nothing T x T is kept and backward recomputes
// P from the saved row log-sum-exp (one GEMM and one exponential per score more). Backward
// fills a head's dS (and P, when recomputed) query block by query block, then takes dK and dV
// by blocks of keys, each one product over every later query. No mask tensor; a head's K (and
// V in backward) is copied transposed once, T x hd elements, so that every product runs along
// keys; the next head's operands are fetched into the cache while a head's products run.
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

// Where the heads of one attention call lie: q, k, v (and, in backward, dq, dk, dv) as rows of
// T per batch entry with their own row strides; query head h in columns [h*hd, (h+1)*hd) of
// q's rows, its key/value head h / (hq / hkv) in those of k's and v's. Packed qkv is the case
// of three column ranges of one (B, T, 3C) tensor with one stride and hkv = hq.
template <class T>
struct HeadLayout {
  int64_t b, t, hq, hkv, hd;
  const T* q;
  const T* k;
  const T* v;
  int64_t ldq, ldk, ldv;
  int64_t group() const { return hq / hkv; }
};

template <class T>
struct HeadGrads {
  T* dq;
  T* dk;
  T* dv;
  int64_t ldq, ldk, ldv;
};

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

// The query head after (b, h) in the loops' order (heads inside batches) as (nb, nh); false
// for the last.
bool nextHead(int64_t batches, int64_t heads, int64_t b, int64_t h, int64_t* nb, int64_t* nh) {
  if (b * heads + h + 1 >= batches * heads) return false;
  *nb = h + 1 < heads ? b : b + 1;
  *nh = h + 1 < heads ? h + 1 : 0;
  return true;
}

// The forward over every head of `l`: y (B, T, hq*hd), lse (B, hq, T), kept P (B, hq, T, T)
// or null. The loops run over key/value heads and, inside, their query heads, so that a
// head's K^T is made once for its whole group.
template <class T>
void forwardHeads(const HeadLayout<T>& l, T* y, T* lse, T* kept) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(l.hd)));
  const int64_t ldy = l.hq * l.hd, group = l.group();
  const int64_t qb = queryBlock(l.t);
  std::vector<T> block(static_cast<size_t>(qb * l.t));  // (qb, T): S, then P
  std::vector<T> kt(static_cast<size_t>(l.hd * l.t));   // (hd, T): K^T of the key/value head
  for (int64_t b = 0; b < l.b; ++b)
    for (int64_t g = 0; g < l.hkv; ++g) {
      const T* k = l.k + b * l.t * l.ldk + g * l.hd;  // (T, hd), row stride ldk
      const T* v = l.v + b * l.t * l.ldv + g * l.hd;
      transposeHead(k, l.ldk, l.t, l.hd, kt.data());
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* q = l.q + b * l.t * l.ldq + h * l.hd;  // (T, hd), row stride ldq
        T* yb = y + b * l.t * ldy + h * l.hd;             // (T, hd), row stride hq*hd
        T* lseb = lse + (b * l.hq + h) * l.t;
        // (T, T) of the head when P is kept: each block's S and P go straight there.
        T* pb = kept ? kept + (b * l.hq + h) * l.t * l.t : nullptr;
        if (int64_t nb, nh; nextHead(l.b, l.hq, b, h, &nb, &nh)) {
          const int64_t ng = nh / group;
          prefetchRows(l.q + nb * l.t * l.ldq + nh * l.hd, l.ldq, l.t, l.hd * sizeof(T));
          if (ng != g || nb != b) {
            prefetchRows(l.k + nb * l.t * l.ldk + ng * l.hd, l.ldk, l.t, l.hd * sizeof(T));
            prefetchRows(l.v + nb * l.t * l.ldv + ng * l.hd, l.ldv, l.t, l.hd * sizeof(T));
          }
          prefetchRows(y + nb * l.t * ldy + nh * l.hd, ldy, l.t, l.hd * sizeof(T), true);
        }
        for (int64_t r0 = 0; r0 < l.t; r0 += qb) {
          const int64_t rows = std::min(qb, l.t - r0), keys = r0 + rows;
          T* sp = pb ? pb + r0 * l.t : block.data();
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, keys, l.hd, scale, q + r0 * l.ldq, l.ldq, kt.data(), l.t,
                          T(0), sp, l.t);
          causalSoftmaxBlock(sp, l.t, rows, keys, r0, lseb + r0, false);
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, l.hd, keys, T(1), sp, l.t, v, l.ldv, T(0), yb + r0 * ldy,
                          ldy);
        }
      }
    }
}

// The backward over every head of `l` from dY (B, T, hq*hd), the forward's lse and its kept P
// (or null: recomputed). A key/value head's dK and dV are the sums over its query heads: the
// first of the group writes them, the others add.
template <class T>
void backwardHeads(const HeadLayout<T>& l, const T* grad, const T* lse, const T* kept, const HeadGrads<T>& d) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(l.hd)));
  const int64_t ldy = l.hq * l.hd, group = l.group();
  const int64_t qb = queryBlock(l.t);
  // The head's P (when not kept) and dS, (T, T) each: the query blocks fill their rows up
  // to their last key, and dK, dV are then taken by key blocks over every later query.
  std::vector<T> p(static_cast<size_t>(l.t * l.t)), ds(p.size());
  std::vector<T> kt(static_cast<size_t>(l.hd * l.t)), vt(kt.size());  // (hd, T): K^T, V^T
  for (int64_t b = 0; b < l.b; ++b)
    for (int64_t g = 0; g < l.hkv; ++g) {
      const T* k = l.k + b * l.t * l.ldk + g * l.hd;
      const T* v = l.v + b * l.t * l.ldv + g * l.hd;
      T* dk = d.dk + b * l.t * d.ldk + g * l.hd;
      T* dv = d.dv + b * l.t * d.ldv + g * l.hd;
      if (!kept) transposeHead(k, l.ldk, l.t, l.hd, kt.data());  // only to recompute S
      transposeHead(v, l.ldv, l.t, l.hd, vt.data());
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* q = l.q + b * l.t * l.ldq + h * l.hd;
        T* dq = d.dq + b * l.t * d.ldq + h * l.hd;
        const T* gy = grad + b * l.t * ldy + h * l.hd;  // (T, hd), row stride hq*hd
        const T* lseb = lse + (b * l.hq + h) * l.t;
        const T* pb = kept ? kept + (b * l.hq + h) * l.t * l.t : nullptr;
        // The next query head's rows [i0, i0 + n), fetched a query block at a time.
        int64_t nb = 0, nh = 0;
        const bool more = nextHead(l.b, l.hq, b, h, &nb, &nh);
        const auto fetchNext = [&](int64_t i0, int64_t n) {
          if (!more) return;
          const int64_t ng = nh / group;
          prefetchRows(l.q + (nb * l.t + i0) * l.ldq + nh * l.hd, l.ldq, n, l.hd * sizeof(T));
          prefetchRows(d.dq + (nb * l.t + i0) * d.ldq + nh * l.hd, d.ldq, n, l.hd * sizeof(T), true);
          if (ng != g || nb != b) {
            prefetchRows(l.k + (nb * l.t + i0) * l.ldk + ng * l.hd, l.ldk, n, l.hd * sizeof(T));
            prefetchRows(l.v + (nb * l.t + i0) * l.ldv + ng * l.hd, l.ldv, n, l.hd * sizeof(T));
            prefetchRows(d.dk + (nb * l.t + i0) * d.ldk + ng * l.hd, d.ldk, n, l.hd * sizeof(T), true);
            prefetchRows(d.dv + (nb * l.t + i0) * d.ldv + ng * l.hd, d.ldv, n, l.hd * sizeof(T), true);
          }
          prefetchRows(grad + (nb * l.t + i0) * ldy + nh * l.hd, ldy, n, l.hd * sizeof(T));
          if (pb) prefetchRows(kept + (nb * l.hq + nh) * l.t * l.t + i0 * l.t, l.t, n, l.t * sizeof(T));
        };
        const T* ph = pb ? pb : p.data();
        for (int64_t r0 = 0; r0 < l.t; r0 += qb) {
          const int64_t rows = std::min(qb, l.t - r0), keys = r0 + rows;
          fetchNext(r0, rows);
          // P of the block: kept by the forward, or again from the saved log-sum-exp.
          if (!pb) {
            detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, keys, l.hd, scale, q + r0 * l.ldq, l.ldq, kt.data(),
                            l.t, T(0), p.data() + r0 * l.t, l.t);
            causalSoftmaxBlock(p.data() + r0 * l.t, l.t, rows, keys, r0, const_cast<T*>(lseb) + r0, true);
          }
          const T* pr = ph + r0 * l.t;
          T* dsr = ds.data() + r0 * l.t;
          // dP = dY_r V^T; dS = P (dP - rowsum(P dP)) / sqrt(hd), the row sum taken over the P
          // in hand (as PyTorch's softmax backward does) rather than as the equal dY . Y: the
          // key third of the qkv bias, whose true gradient is zero, then gets the rounding of
          // P's row sums only; dQ_r = dS K.
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, keys, l.hd, T(1), gy + r0 * ldy, ldy, vt.data(), l.t,
                          T(0), dsr, l.t);
          if constexpr (std::is_same_v<T, float>) {
            detail::softmaxBackwardRows(pr, l.t, dsr, l.t, rows, keys, scale);
          } else {
            for (int64_t i = 0; i < rows; ++i) {
              const T* prow = pr + i * l.t;
              T* row = dsr + i * l.t;
              T dot = 0;
              for (int64_t j = 0; j < keys; ++j) dot += prow[j] * row[j];
              for (int64_t j = 0; j < keys; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
            }
          }
          detail::gemm<T>(CblasNoTrans, CblasNoTrans, rows, l.hd, keys, T(1), dsr, l.t, k, l.ldk, T(0),
                          dq + r0 * d.ldq, d.ldq);
        }
        // Keys k0.. of a block are seen by the queries from k0 on, whose rows of P and dS the
        // loop above filled up to this block's last key: dV_k = P^T dY and dK_k = dS^T Q over
        // those queries, one product each (added to the group's earlier heads').
        const T beta = h == g * group ? T(0) : T(1);
        for (int64_t k0 = 0; k0 < l.t; k0 += qb) {
          const int64_t cols = std::min(qb, l.t - k0), queries = l.t - k0;
          detail::gemm<T>(CblasTrans, CblasNoTrans, cols, l.hd, queries, T(1), ph + k0 * l.t + k0, l.t,
                          gy + k0 * ldy, ldy, beta, dv + k0 * d.ldv, d.ldv);
          detail::gemm<T>(CblasTrans, CblasNoTrans, cols, l.hd, queries, T(1), ds.data() + k0 * l.t + k0, l.t,
                          q + k0 * l.ldq, l.ldq, beta, dk + k0 * d.ldk, d.ldk);
        }
      }
    }
}

// The packed (B, T, 3C) layout of qkv's data (or of its gradient's, `out`).
template <class T>
HeadLayout<T> packedLayout(const AttentionSizes& s, const T* qkv) {
  return {s.b, s.t, s.h, s.h, s.hd, qkv, qkv + s.c, qkv + 2 * s.c, 3 * s.c, 3 * s.c, 3 * s.c};
}

struct GroupedSizes {
  int64_t b, t, hq, hkv, hd;
};

GroupedSizes groupedSizes(const Tensor& q, const Tensor& k, const Tensor& v, int64_t headDim) {
  KOLO_REQUIRE(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.shape() == v.shape() &&
                   q.shape()[0] == k.shape()[0] && q.shape()[1] == k.shape()[1],
               "causal attention: q ", shapeString(q.shape()), ", k ", shapeString(k.shape()), " and v ",
               shapeString(v.shape()), " are not (B, T, Hq*d), (B, T, Hkv*d) and (B, T, Hkv*d)");
  KOLO_REQUIRE(headDim > 0 && q.shape()[2] % headDim == 0 && k.shape()[2] % headDim == 0 && k.shape()[2] > 0,
               "causal attention: head size ", headDim, " does not divide the widths of q ",
               shapeString(q.shape()), " and k ", shapeString(k.shape()));
  const int64_t hq = q.shape()[2] / headDim, hkv = k.shape()[2] / headDim;
  KOLO_REQUIRE(hq % hkv == 0, "causal attention: ", hkv, " key/value heads (k ", shapeString(k.shape()),
               ") do not divide ", hq, " query heads (q ", shapeString(q.shape()), ") of size ", headDim);
  return {q.shape()[0], q.shape()[1], hq, hkv, headDim};
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
    forwardHeads(packedLayout(s, qkv.data<T>()), y.data<T>(), lse.data<T>(),
                 kept.defined() ? kept.data<T>() : nullptr);
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
    T* o = out.data<T>();
    backwardHeads(packedLayout(s, qkv.data<T>()), grad.data<T>(), lse.data<T>(),
                  kept.defined() ? kept.data<T>() : nullptr,
                  HeadGrads<T>{o, o + s.c, o + 2 * s.c, 3 * s.c, 3 * s.c, 3 * s.c});
  });
  return out;
}

Tensor groupedAttentionForward(const Tensor& q0, const Tensor& k0, const Tensor& v0, int64_t headDim,
                               Tensor* logSumExp, Tensor* probabilities) {
  const GroupedSizes s = groupedSizes(q0, k0, v0, headDim);
  Tensor q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous();
  KOLO_REQUIRE(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "causal attention: q, k and v dtypes ",
               dtypeName(q.dtype()), ", ", dtypeName(k.dtype()), " and ", dtypeName(v.dtype()), " differ");
  Tensor y = Tensor::empty(q.shape(), q.dtype());
  Tensor lse = Tensor::empty({s.b, s.hq, s.t}, q.dtype());
  Tensor kept = probabilities ? Tensor::empty({s.b, s.hq, s.t, s.t}, q.dtype()) : Tensor();
  detail::dispatchFloat(q.dtype(), "causal attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const HeadLayout<T> l{s.b, s.t, s.hq, s.hkv, s.hd, q.data<T>(), k.data<T>(), v.data<T>(),
                          s.hq * s.hd, s.hkv * s.hd, s.hkv * s.hd};
    forwardHeads(l, y.data<T>(), lse.data<T>(), kept.defined() ? kept.data<T>() : nullptr);
  });
  if (logSumExp) *logSumExp = lse;
  if (probabilities) *probabilities = kept;
  return y;
}

void groupedAttentionBackward(const Tensor& grad0, const Tensor& q0, const Tensor& k0, const Tensor& v0,
                              int64_t headDim, const Tensor& logSumExp, const Tensor& probabilities, Tensor* gradQ,
                              Tensor* gradK, Tensor* gradV) {
  const GroupedSizes s = groupedSizes(q0, k0, v0, headDim);
  KOLO_CHECK(grad0.shape() == q0.shape() && logSumExp.shape() == (Shape{s.b, s.hq, s.t}),
             "causal attention backward: gradient ", shapeString(grad0.shape()), " and log-sum-exp ",
             shapeString(logSumExp.shape()), " do not match q ", shapeString(q0.shape()));
  KOLO_CHECK(!probabilities.defined() || probabilities.shape() == (Shape{s.b, s.hq, s.t, s.t}),
             "causal attention backward: probabilities ", shapeString(probabilities.shape()), " do not match q ",
             shapeString(q0.shape()));
  Tensor q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous();
  Tensor grad = grad0.contiguous(), lse = logSumExp.contiguous();
  Tensor kept = probabilities.defined() ? probabilities.contiguous() : Tensor();
  Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype()),
         dv = Tensor::empty(v.shape(), v.dtype());
  detail::dispatchFloat(q.dtype(), "causal attention backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t ldq = s.hq * s.hd, ldkv = s.hkv * s.hd;
    const HeadLayout<T> l{s.b, s.t, s.hq, s.hkv, s.hd, q.data<T>(), k.data<T>(), v.data<T>(), ldq, ldkv, ldkv};
    backwardHeads(l, grad.data<T>(), lse.data<T>(), kept.defined() ? kept.data<T>() : nullptr,
                  HeadGrads<T>{dq.data<T>(), dk.data<T>(), dv.data<T>(), ldq, ldkv, ldkv});
  });
  *gradQ = dq;
  *gradK = dk;
  *gradV = dv;
}

}  // namespace kolo::kernels
