// Built-in communication hooks for the Reducer (kolo/parallel/comm_hook.h): the plain
// all-reduce, fp16/bf16 casts, PowerSGD low-rank compression and top-k sparsification, the
// last two with error feedback. Selected by `kolo train --compress SPEC`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kolo/dtype.h"
#include "kolo/parallel/comm_hook.h"

namespace kolo::parallel::compression {

/// The plain all-reduce of the bucket, as a hook (PyTorch's allreduce_hook): the same sums
/// as the reducer without a hook. Any reducer dtype.
std::shared_ptr<CommHook> allreduceHook();

/// fp16 / bf16 compression (PyTorch's fp16_compress_hook, bf16_compress_hook): each value is
/// divided by the world size (so that the sum of the ranks' values cannot overflow the
/// 16-bit range where the average does not), cast to `wire` (F16 or BF16, rounded to
/// nearest even), all-reduced as 16-bit sums, cast back and multiplied by the world size.
/// The result is within the 16-bit type's relative precision of the exact sum (2^-11 for
/// f16, 2^-8 for bf16, per addition). f32 buckets only.
std::shared_ptr<CommHook> castHook(DType wire);

struct PowerSgdOptions {
  /// Rank r of the approximation (PyTorch's matrix_approximation_rank); >= 1.
  int rank = 1;
  /// Steps (passes) reduced with the plain all-reduce before compression starts
  /// (start_powerSGD_iter); error feedback starts with compression.
  int64_t startStep = 10;
  /// A gradient n x m is compressed only when n*m >= minCompressionRate * (n+m)*r;
  /// others (and every vector) travel uncompressed in one all-reduce per bucket.
  double minCompressionRate = 2.0;
  bool errorFeedback = true;
  /// Reuse each matrix's Q from the last step (one power iteration per step in all).
  bool warmStart = true;
  /// Seed of the initial Q matrices, identical on every rank.
  uint64_t seed = 0;
};

/// PowerSGD (Vogels et al., 2019; PyTorch's powerSGD_hook). Every gradient with two or
/// more dimensions is seen as a matrix M (n = shape[0], m = numel / n) and, per rank i,
/// M_i += residual_i (error feedback); then P = sum_i M_i Q (all-reduced, n x r), P is
/// orthonormalised (Gram-Schmidt), Q = sum_i M_i^T P (all-reduced, m x r), and the bucket
/// gets P Q^T, an approximation of sum_i M_i of rank r = min(rank, n, m). residual_i =
/// M_i - P Q^T / worldSize: what rank i's update lacked, added to its next gradient. With
/// r = min(n, m) the result is exact up to rounding. Bytes on the wire per matrix:
/// (n + m) r elements instead of n m. f32 buckets only. State (saved in checkpoints): the
/// step count, each bucket's residual and each matrix's Q.
std::shared_ptr<CommHook> powerSgdHook(PowerSgdOptions options);

struct TopKOptions {
  /// Share of each bucket's elements each rank sends, in (0, 1].
  double fraction = 0.01;
  bool errorFeedback = true;
};

/// Top-k sparsification with error feedback: each rank adds its residual to the bucket,
/// keeps the k = ceil(fraction * numel) elements of largest magnitude (ties: lower index),
/// and all-gathers their indices (i32) and values; every rank sums the ranks' sparse
/// vectors, in rank order. residual_i = what rank i did not send. f32 buckets only. State:
/// each bucket's residual.
std::shared_ptr<CommHook> topKHook(TopKOptions options);

/// A parsed compression spec (DataParallelOptions::commHook's, `kolo train --compress`).
struct CompressSpec {
  std::string method = "none";  // none | fp16 | bf16 | powersgd | topk
  int rank = 0;                 // powersgd
  double fraction = 0.0;        // topk
};

/// Parses "none", "fp16", "bf16", "powersgd:RANK" (RANK an integer >= 1) or
/// "topk:FRACTION" (0 < FRACTION <= 1). Throws InvalidArgument naming `what` (default:
/// the parser itself, which `kolo` names --compress) and the bad value.
CompressSpec parseCompressSpec(const std::string& spec, const std::string& what = "parseCompressSpec");

/// The hook of a spec; nullptr for "none" (the reducer's own all-reduce).
/// `powerSgdStartStep` is PowerSgdOptions::startStep for "powersgd".
std::shared_ptr<CommHook> makeCommHook(const CompressSpec& spec, int64_t powerSgdStartStep = 10);

}  // namespace kolo::parallel::compression
