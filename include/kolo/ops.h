// Differentiable tensor operations (namespace kolo). Each op computes its result with the
// raw kernels of the tensor layer and, when grad mode is on and an input requires grad,
// records a backward node. Binary ops broadcast as NumPy/PyTorch do, and their gradients
// are summed back to each input's shape. f32 and f64 compute; other dtypes throw.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "kolo/autograd.h"
#include "kolo/tensor.h"

namespace kolo {

// ---- elementwise arithmetic (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise maximum / minimum (gradient goes to the larger / smaller; ties to a).
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
/// a * x + b with scalars.
Tensor affine(const Tensor& x, double scale, double shift);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(const Tensor& a, double s);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(const Tensor& a, double s);
Tensor operator/(double s, const Tensor& a);

// ---- elementwise functions ----
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
/// Exact GELU, x * Phi(x) (PyTorch's default approximate='none').
Tensor gelu(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);

// ---- reductions ----
/// Sum of all elements (shape {}).
Tensor sum(const Tensor& x);
/// Sum over `dims`; keepdim keeps them with size 1.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Max over one dimension (values only; the gradient goes to the first maximum).
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Max of all elements (shape {}).
Tensor max(const Tensor& x);
/// Indices of the maximum along dim (i64, not differentiable).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

// ---- linear algebra ----
/// Matrix product with PyTorch's matmul rules: 1-d operands are promoted, 2-d x 2-d is a
/// GEMM, N-d x 2-d folds the leading dimensions, N-d x N-d broadcasts batch dimensions.
/// Throws InvalidArgument naming both shapes when the inner dimensions differ.
Tensor matmul(const Tensor& a, const Tensor& b);
/// Batched [B,M,K] x [B,K,N] -> [B,M,N].
Tensor bmm(const Tensor& a, const Tensor& b);
/// x @ weight^T + bias for x [..., in], weight [out, in], bias [out] (may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

/// gelu(linear(x, weight, bias)) as one op: for f32 with a bias, the bias and the GELU go in
/// one pass over the GEMM's output and backward computes the GELU's gradient and the bias's
/// in one pass; otherwise the separate ops. Throws as linear.
Tensor linearGelu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- neural-network functions ----
Tensor softmax(const Tensor& x, int64_t dim);
Tensor logSoftmax(const Tensor& x, int64_t dim);
/// Mean cross-entropy of logits [N, C] against i64 (or i32) class labels [N] (shape {}); of
/// logits [..., C] against labels [...] (a sequence's scores, the classes last), the mean over
/// every position. Throws InvalidArgument naming both shapes when they do not match, and for
/// a label outside [0, C).
Tensor crossEntropy(const Tensor& logits, const Tensor& labels);
/// 2-d convolution, x [N,C,H,W], weight [O,C,kh,kw], bias [O] (may be undefined).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride = 1,
              int64_t padding = 0);
/// Max-pooling with a square kernel; stride defaults to the kernel size.
Tensor maxPool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);
/// Average pooling with a square kernel; stride defaults to the kernel size; the zero padding
/// counts in the divisor (torch's avg_pool2d defaults). x (N, C, H, W).
Tensor avgPool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);
/// Adaptive average pooling of x (N, C, H, W) to (N, C, outH, outW) with PyTorch's bins:
/// output row i averages rows [floor(i H / outH), ceil((i + 1) H / outH)), columns alike.
Tensor adaptiveAvgPool2d(const Tensor& x, int64_t outH, int64_t outW);
/// Sums `values` element-wise over the replicas of a data-parallel group, in place (an
/// all-reduce); every replica calls it at the same point with as many values.
using GroupSum = std::function<void(std::vector<double>& values)>;
/// Batch normalisation of x (N, C, ...) per channel (torch.nn.functional.batch_norm).
/// Training: normalises with the batch's mean and biased variance and, where runningMean and
/// runningVar (C) are defined, moves them in place: running = (1 - momentum) running +
/// momentum batch, the variance unbiased. With `groupSum` the batch is the group's global
/// batch, as PyTorch's SyncBatchNorm: forward sums each channel's count, sum and squared
/// deviations over the group (one call of 2C + 1 values), and backward, where x needs its
/// gradient, the output gradient's two sums per channel (one call of 2C values); weight's and
/// bias's gradients stay this replica's own. Not training: normalises with the running
/// statistics. weight and bias (C) may be undefined. Throws InvalidArgument for an input of
/// fewer than two dimensions, (C) tensors of another size, or one value per channel when
/// training.
Tensor batchNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& runningMean,
                 const Tensor& runningVar, bool training, double momentum = 0.1, double eps = 1e-5,
                 const GroupSum& groupSum = {});
/// relu(batchNorm(x, ...) + residual), or relu(batchNorm(x, ...)) with residual undefined, as
/// one op: the same values and gradients (residual's included) as the three ops, in one pass
/// over the values forward and two backward instead of their five and four. The residual has
/// x's shape and dtype (InvalidArgument otherwise); the rest as batchNorm.
Tensor batchNormRelu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                     const Tensor& runningMean, const Tensor& runningVar, bool training, double momentum = 0.1,
                     double eps = 1e-5, const GroupSum& groupSum = {});
/// Layer normalisation over the trailing dimensions `normalizedShape`; weight and bias
/// (shape normalizedShape) may be undefined.
Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight, const Tensor& bias,
                 double eps = 1e-5);
/// Causal multi-head self-attention over packed projections, in one op: qkv (B, T, 3C) holds
/// q, k and v (head h in columns [h*hd, (h+1)*hd) of each third, hd = C/heads); returns
/// (B, T, C) where each head's y_t = sum over s <= t of softmax_s(q_t . k_s / sqrt(hd)) v_s
/// (torch's softmax((q k^T) / sqrt(hd)) with the causal mask, then @ v, heads concatenated).
/// Computed by blocks as flash attention is: backward holds qkv, a (B, H, T) log-sum-exp
/// and, while H T <= 3C (P no larger than qkv), the probabilities P (B, H, T, T); beyond
/// that nothing T x T is kept and backward recomputes P. Throws InvalidArgument for a shape
/// that is not (B, T, 3C) with heads dividing C.
Tensor causalAttention(const Tensor& qkv, int64_t heads);
/// Rotary position embedding (RoPE) of causalAttention's queries and keys: in each head of
/// size d, the pair of elements (2i, 2i+1) at position p = offset + t is rotated, as the
/// complex number x_2i + i x_2i+1 times e^(i p theta^(-2i/d)) (Meta's LLaMA and torchtitan's
/// apply_rotary_emb; Hugging Face's rotate_half pairs i with i + d/2 instead, a permutation
/// of the projections' rows). `offset` is the position of the first of the T tokens.
struct Rotary {
  double theta = 10000.0;
  int64_t offset = 0;
};
/// Causal attention over separate projections, in one op, with grouped key/value heads and
/// optional rotary positions: q (B, T, Hq*headDim), k and v (B, T, Hkv*headDim), the numbers
/// of heads read from the widths, Hkv dividing Hq (Hkv = Hq: multi-head; Hkv = 1: multi-query);
/// query head h attends with key/value head h / (Hq / Hkv). Returns (B, T, Hq*headDim), each
/// head's y_t = sum over s <= t of softmax_s(q_t . k_s / sqrt(headDim)) v_s, with q and k
/// first rotated by `rotary` when it is given (inside the op: no separate node, no copy kept
/// beyond the rotated q and k that backward reads instead of q and k). Computed by blocks as
/// causalAttention(qkv, heads) is, nothing T x T kept unless P is no larger than q, k and v
/// together. Any module whose projections make such widths can call it; a tensor-parallel
/// split of the projections on head boundaries leaves each rank a valid call. Throws
/// InvalidArgument naming the shapes when they are not so, or for an odd headDim with rotary.
Tensor causalAttention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t headDim,
                       std::optional<Rotary> rotary = std::nullopt);
/// The rotation of causalAttention's rotary positions applied to x (B, T, H*headDim) alone,
/// differentiable (its gradient is the inverse rotation).
Tensor rotaryEmbedding(const Tensor& x, int64_t headDim, const Rotary& rotary);
/// RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight (weight [C] may be
/// undefined), in one pass forward and one backward. Throws InvalidArgument for a weight whose
/// shape is not [C].
Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
/// SiLU (swish), x * sigmoid(x).
Tensor silu(const Tensor& x);
/// The SwiGLU gate silu(gate) * up as one op (one pass forward and backward, keeping gate and
/// up only). Throws InvalidArgument when the shapes differ.
Tensor swiglu(const Tensor& gate, const Tensor& up);
/// Rows of weight [V, D] selected by integer indices -> indices.shape + [D].
Tensor embedding(const Tensor& indices, const Tensor& weight);
/// Inverted dropout: zeroes each element with probability p and scales the rest by
/// 1/(1-p) when training; identity otherwise. Draws from gen.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

// ---- joining and selection ----
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
/// cond ? a : b elementwise with broadcasting (cond nonzero = true; not differentiated).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// x with `value` where mask is nonzero (e.g. -inf above the diagonal for causal attention).
Tensor maskedFill(const Tensor& x, const Tensor& mask, double value);
/// Lower-triangular [n, n] u8 mask of ones (the causal mask's allowed positions).
Tensor trilMask(int64_t n);

}  // namespace kolo
