// Raw CPU kernels of the tensor layer: views, copies, broadcasting elementwise math,
// reductions, GEMM-based matmul and convolution, pooling and the fused nn kernels.
// Nothing here records gradients; kolo/ops.h (autograd layer) wraps these in backward nodes.
#pragma once

#include <cstdint>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::kernels {

// ---- copies and views (views share storage; results carry no autograd state) ----

/// Copies src into dst element by element (shapes equal; dtypes converted; any strides).
void copyInto(Tensor& dst, const Tensor& src);
/// Resolves one -1 in `shape` against numel; checks the element count.
Shape inferShape(const Shape& shape, int64_t numel, const Shape& from);
/// View with a new shape; throws InvalidArgument when the strides do not allow it.
Tensor viewRaw(const Tensor& x, const Shape& shape);
/// View when possible, otherwise a contiguous copy.
Tensor reshapeRaw(const Tensor& x, const Shape& shape);
Tensor transposeRaw(const Tensor& x, int64_t d0, int64_t d1);
Tensor permuteRaw(const Tensor& x, const std::vector<int64_t>& dims);
Tensor sliceRaw(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor expandRaw(const Tensor& x, const Shape& shape);
Tensor unsqueezeRaw(const Tensor& x, int64_t dim);
Tensor squeezeRaw(const Tensor& x, int64_t dim);
/// Normalises a possibly negative dimension index against rank nd.
int64_t wrapDim(int64_t d, int64_t nd, const char* op);

// ---- elementwise ----

/// NumPy/PyTorch broadcast of two shapes; throws naming both shapes and `op`.
Shape broadcastShapes(const Shape& a, const Shape& b, const char* op);

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Max, Min, Gt, Lt, Eq };
/// out = a op b with broadcasting (comparisons give 1/0 of the float dtype).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
/// dst += alpha * src where src broadcasts to dst's shape (dst may be strided).
void addInPlace(Tensor& dst, const Tensor& src, double alpha = 1.0);
/// dst *= s.
void scaleInPlace(Tensor& dst, double s);

enum class UnaryOp { Neg, Exp, Log, Tanh, Sigmoid, Relu, Gelu, Sqrt, Abs };
Tensor unary(UnaryOp op, const Tensor& x);
/// a * x + b elementwise, and x ^ p.
Tensor affineScalar(const Tensor& x, double a, double b);
Tensor powScalar(const Tensor& x, double p);

/// What ReLU's backward keeps instead of its output: one bit per element of y (y > 0), eight
/// to a byte, element i in bit i % 8 of byte i / 8 (U8, ceil(numel / 8) elements).
Tensor positiveMask(const Tensor& y);
/// ReLU's gradient: grad where the mask (positiveMask of the output) has its bit set, else 0.
Tensor reluBackward(const Tensor& grad, const Tensor& mask);
/// reluBackward written over grad's own elements (grad contiguous, a float dtype); for a
/// gradient buffer that nothing else references.
void reluBackwardInPlace(Tensor& grad, const Tensor& mask);
/// Gradients of the other activations given the saved input x or output y.
Tensor geluBackward(const Tensor& grad, const Tensor& x);
Tensor tanhBackward(const Tensor& grad, const Tensor& y);
Tensor sigmoidBackward(const Tensor& grad, const Tensor& y);

/// cond ? a : b with broadcasting; cond is any dtype, nonzero meaning true.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- reductions ----

/// Sum over `dims` (empty: all). keepdim keeps reduced dimensions as size 1.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
/// Sums a broadcast gradient back to `shape` (the inverse of broadcasting).
Tensor sumToShape(const Tensor& x, const Shape& shape);
/// Max over one dimension; indices (i64, same shape as values) may be null.
Tensor maxDim(const Tensor& x, int64_t dim, bool keepdim, Tensor* indices);
/// Scatters grad (shape of the max values) back to the argmax positions of xShape.
Tensor maxDimBackward(const Tensor& grad, const Tensor& indices, const Shape& xShape,
                      int64_t dim, bool keepdim);

// ---- linear algebra ----

/// C = A @ B for 2-d A [M,K], B [K,N]; a transposed view is passed to BLAS as a transpose
/// flag instead of being copied. out (if given) must be contiguous [M,N]; beta scales its
/// previous content.
Tensor matmul2d(const Tensor& a, const Tensor& b, Tensor* out = nullptr, double beta = 0.0);
/// A linear layer's forward: x [M,K] times weight [N,K] transposed, plus bias [N] on every
/// row when it is defined -> [M,N]; with `gelu` not null (f32, bias defined) *gelu = GELU of
/// that result too. f32 products over many rows go in one pass, the bias and GELU applied
/// by the GEMM's tiles; other dtypes, shapes and bf16 products as the product, then the bias
/// (prefilled, beta = 1) or bias and GELU in one pass over it (biasGeluForward).
Tensor linearForward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor* gelu = nullptr);
/// Batched matmul [B,M,K] x [B,K,N] -> [B,M,N].
Tensor bmm(const Tensor& a, const Tensor& b);

// ---- convolution and pooling (NCHW, weights [O, C, kh, kw]) ----

struct Conv2dParams {
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0;
};
Tensor conv2dForward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
/// Gradients of conv2d; any output pointer may be null to skip that gradient. x's values are
/// read only for gradW and w's only for gradX (the other is needed for its shape alone).
void conv2dBackward(const Tensor& grad, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                    Tensor* gradX, Tensor* gradW, Tensor* gradB);
/// Max-pool with kernel k, stride s, padding pad; argmax (i32 flat index into each H*W
/// plane) is written to *indices.
Tensor maxPool2dForward(const Tensor& x, int64_t k, int64_t s, int64_t pad, Tensor* indices);
Tensor maxPool2dBackward(const Tensor& grad, const Tensor& indices, const Shape& xShape);

// ---- fused nn kernels ----

/// Softmax / log-softmax along dim.
Tensor softmax(const Tensor& x, int64_t dim);
Tensor logSoftmax(const Tensor& x, int64_t dim);
Tensor softmaxBackward(const Tensor& grad, const Tensor& y, int64_t dim);
Tensor logSoftmaxBackward(const Tensor& grad, const Tensor& y, int64_t dim);
/// Mean cross-entropy of logits [N,C] against i64 labels [N]; writes softmax into *probs.
Tensor crossEntropyForward(const Tensor& logits, const Tensor& labels, Tensor* probs);
/// d loss / d logits = (probs - onehot) * gradScale / N.
Tensor crossEntropyBackward(const Tensor& probs, const Tensor& labels, double gradScale);
/// LayerNorm over the trailing `normSize` elements; writes per-row mean and rstd.
Tensor layerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t normSize,
                        double eps, Tensor* mean, Tensor* rstd);
void layerNormBackward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, int64_t normSize, Tensor* gradX, Tensor* gradW,
                       Tensor* gradB);
/// Rows of weight [V,D] picked by i64/i32 indices of any shape -> shape + [D].
Tensor embeddingForward(const Tensor& indices, const Tensor& weight);
Tensor embeddingBackward(const Tensor& grad, const Tensor& indices, int64_t numEmbeddings);
/// gelu(pre + bias) for pre (M, N) contiguous f32 from a GEMM, bias (N): adds the bias into
/// pre in place (what backward reads) and returns the activation.
Tensor biasGeluForward(Tensor& pre, const Tensor& bias);
/// Gradient of biasGeluForward: returns d/dpre (M, N) and writes the bias gradient (N) into
/// *gradBias (may be null).
Tensor biasGeluBackward(const Tensor& grad, const Tensor& pre, Tensor* gradBias);
/// Causal multi-head attention over packed qkv (B, T, 3C) (q, k, v the thirds; head h the
/// columns [h*hd, (h+1)*hd) of each, hd = C/heads) -> (B, T, C), by blocks without a T x T
/// scratch matrix; writes each row's log-sum-exp of its scaled scores, (B, H, T), into
/// *logSumExp (may be null), and the attention probabilities P, (B, H, T, T), into
/// *probabilities when it is not null (entries above the diagonal unspecified).
Tensor causalAttentionForward(const Tensor& qkv, int64_t heads, Tensor* logSumExp, Tensor* probabilities = nullptr);
/// Gradient (B, T, 3C) with respect to qkv, from the forward's log-sum-exp, reading P from
/// `probabilities` (the forward's) when it is defined and recomputing it otherwise.
Tensor causalAttentionBackward(const Tensor& grad, const Tensor& qkv, const Tensor& logSumExp, int64_t heads,
                               const Tensor& probabilities = Tensor());
/// Causal attention with grouped key/value heads: q (B, T, Hq*d), k and v (B, T, Hkv*d), Hkv
/// dividing Hq, query head h reading key/value head h / (Hq / Hkv) -> (B, T, Hq*d); the blocks,
/// log-sum-exp (B, Hq, T) and kept P (B, Hq, T, T) of causalAttentionForward.
Tensor groupedAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t headDim, Tensor* logSumExp,
                               Tensor* probabilities = nullptr);
/// Gradients of groupedAttentionForward with respect to q, k and v (a key/value head's the
/// sum over its query heads), P read from `probabilities` when defined, else recomputed.
void groupedAttentionBackward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, int64_t headDim,
                              const Tensor& logSumExp, const Tensor& probabilities, Tensor* gradQ, Tensor* gradK,
                              Tensor* gradV);
/// RMSNorm over the last dimension: x * rstd * weight (weight may be undefined), rstd = 1 /
/// sqrt(mean(x^2) + eps) per row, written to *rstd.
Tensor rmsNormForward(const Tensor& x, const Tensor& weight, double eps, Tensor* rstd);
/// Gradients of rmsNormForward; gradX or gradW may be null to skip that one.
void rmsNormBackward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor* gradX,
                     Tensor* gradW);
/// silu(gate) * up elementwise (same shapes); up undefined: silu(gate).
Tensor swigluForward(const Tensor& gate, const Tensor& up);
/// Gradients of swigluForward; gradUp may be null (and is left undefined when up is).
void swigluBackward(const Tensor& grad, const Tensor& gate, const Tensor& up, Tensor* gradGate, Tensor* gradUp);
/// Rotary position embedding of x (B, T, H*d): in each head, pair (2i, 2i+1) of position
/// offset + t rotated by the angle (offset + t) * theta^(-2i/d); `inverse` rotates back (the
/// gradient). Throws InvalidArgument for an odd d or one that does not divide the width.
Tensor rotaryForward(const Tensor& x, int64_t headDim, double theta, int64_t offset, bool inverse);
/// Concatenates along dim (shapes equal elsewhere).
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);

}  // namespace kolo::kernels
