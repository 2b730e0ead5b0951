// The autograd operations at the edges of tensor-parallel regions: copy in / reduce out
// (all-reduce on one side, identity on the other), the gather of split features, the
// sequence-parallel all-gather, reduce-scatter and split of tokens, and the cross-entropy of
// logits split by vocabulary.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/parallel/tensor_parallel.h"

namespace kolo::parallel {

namespace {

void allreduceInPlace(Tensor& t, comm::Communicator& comm) {
  KOLO_CHECK(t.isContiguous(), "tensor parallel: all-reduce of a non-contiguous tensor");
  comm.allreduce(t.rawData(), t.rawData(), static_cast<size_t>(t.numel()), t.dtype(),
                 comm::ReduceOp::Sum);
}

// (B, t, ...) on every rank -> (B, T·t, ...), rank r's tokens at r·t ... r·t + t − 1.
Tensor allgatherTokens(const Tensor& x, comm::Communicator& comm) {
  const Tensor local = x.detach().contiguous();
  KOLO_REQUIRE(local.dim() >= 2, "sequence parallel: ", shapeString(local.shape()),
               " has no token dimension");
  Shape stacked = local.shape();
  stacked.insert(stacked.begin(), comm.size());  // (T, B, t, ...)
  Tensor all = Tensor::empty(stacked, local.dtype());
  comm.allgather(local.rawData(), all.rawData(), static_cast<size_t>(local.numel()), local.dtype());
  Shape whole = local.shape();
  whole[1] *= comm.size();
  return all.transpose(0, 1).contiguous().reshape(whole);  // (B, T, t, ...) -> (B, T·t, ...)
}

// (B, S, ...) partial sums on every rank -> (B, S/T, ...): this rank's tokens of the sum.
Tensor reduceScatterTokens(const Tensor& x, comm::Communicator& comm) {
  const int64_t parts = comm.size();
  const Shape shape = x.shape();
  KOLO_REQUIRE(shape.size() >= 2 && shape[1] % parts == 0,
               "sequence parallel: ", shape.size() >= 2 ? shape[1] : 0,
               " tokens cannot be split over ", parts,
               " ranks (the sequence length must be a multiple of the tensor-parallel size)");
  Shape blocks = shape;
  blocks[1] = shape[1] / parts;
  blocks.insert(blocks.begin() + 1, parts);  // (B, T, S/T, ...)
  const Tensor byRank =
      x.detach().contiguous().reshape(blocks).transpose(0, 1).contiguous();  // (T, B, S/T, ...)
  Shape mine = shape;
  mine[1] /= parts;
  Tensor out = Tensor::empty(mine, x.dtype());
  comm.reduceScatter(byRank.rawData(), out.rawData(), static_cast<size_t>(out.numel()), out.dtype(),
                     comm::ReduceOp::Sum);
  return out;
}

// (B, S, ...) -> (B, S/T, ...): this rank's tokens, copied.
Tensor ownTokens(const Tensor& x, comm::Communicator& comm) {
  const int64_t parts = comm.size();
  KOLO_REQUIRE(x.dim() >= 2 && x.shape()[1] % parts == 0, "sequence parallel: ",
               x.dim() >= 2 ? x.shape()[1] : 0, " tokens cannot be split over ", parts,
               " ranks (the sequence length must be a multiple of the tensor-parallel size)");
  const int64_t part = x.shape()[1] / parts;
  return x.detach().slice(1, comm.rank() * part, (comm.rank() + 1) * part).contiguous().clone();
}

// (..., n) on every rank -> (..., T·n), rank r's features at r·n ... r·n + n − 1.
Tensor allgatherFeatures(const Tensor& x, comm::Communicator& comm) {
  const Tensor local = x.detach().contiguous();
  Shape stacked = local.shape();
  stacked.insert(stacked.begin(), comm.size());  // (T, ..., n)
  Tensor all = Tensor::empty(stacked, local.dtype());
  comm.allgather(local.rawData(), all.rawData(), static_cast<size_t>(local.numel()), local.dtype());
  std::vector<int64_t> order;
  for (int64_t d = 1; d <= local.dim(); ++d) order.push_back(d);
  order.insert(order.end() - 1, 0);  // (..., T, n)
  Shape whole = local.shape();
  whole.back() *= comm.size();
  return all.permute(order).contiguous().reshape(whole);
}

}  // namespace

Tensor gatherFeatures(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  const int64_t width = x.shape().back();
  return autograd::record(allgatherFeatures(x, *comm), {x}, "GatherFeatures",
                          [comm, width](const Tensor& g) {
                            const int64_t first = comm->rank() * width;
                            return std::vector<Tensor>{
                                g.slice(g.dim() - 1, first, first + width).contiguous().clone()};
                          });
}

Tensor splitSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  return autograd::record(ownTokens(x, *comm), {x}, "SplitSequence", [comm](const Tensor& g) {
    return std::vector<Tensor>{allgatherTokens(g, *comm)};
  });
}

Tensor copyToTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  Tensor out = x.detach();
  return autograd::record(out, {x}, "CopyToTensorParallel", [comm](const Tensor& g) {
    Tensor sum = g.contiguous().clone();
    allreduceInPlace(sum, *comm);
    return std::vector<Tensor>{sum};
  });
}

Tensor reduceFromTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  Tensor out = x.detach().contiguous().clone();
  allreduceInPlace(out, *comm);
  return autograd::record(out, {x}, "ReduceFromTensorParallel",
                          [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor gatherSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  return autograd::record(
      allgatherTokens(x, *comm), {x}, "GatherSequence",
      [comm](const Tensor& g) { return std::vector<Tensor>{reduceScatterTokens(g, *comm)}; });
}

Tensor scatterSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm) {
  return autograd::record(
      reduceScatterTokens(x, *comm), {x}, "ScatterSequence",
      [comm](const Tensor& g) { return std::vector<Tensor>{allgatherTokens(g, *comm)}; });
}

Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                 std::shared_ptr<comm::Communicator> comm) {
  KOLO_REQUIRE(logits.dtype() == DType::F32 && logits.dim() >= 1 && logits.shape().back() > 0 &&
                   logits.numel() / logits.shape().back() == targets.numel() && targets.numel() > 0,
               "vocabParallelCrossEntropy: logits ", shapeString(logits.shape()), " (",
               dtypeName(logits.dtype()), ") do not match targets ", shapeString(targets.shape()));
  const int64_t part = logits.shape().back(), rows = targets.numel(), first = comm->rank() * part;
  const Tensor x = logits.detach().contiguous();
  const float* in = x.data<float>();
  const std::vector<double> target = targets.toDoubleVector();
  // Per row: the largest logit, then the sum of exp(logit − largest), then the target's
  // logit (held by one rank, zero on the others), each all-reduced over the vocabulary.
  std::vector<float> rowMax(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < part; ++j)
      rowMax[static_cast<size_t>(i)] = std::max(rowMax[static_cast<size_t>(i)], in[i * part + j]);
  comm->allreduce(rowMax.data(), rowMax.data(), rowMax.size(), DType::F32, comm::ReduceOp::Max);
  Tensor probabilities = Tensor::empty({rows, part}, DType::F32);  // (N, V/T)
  float* p = probabilities.data<float>();
  std::vector<double> sums(static_cast<size_t>(rows), 0.0),
      targetLogit(static_cast<size_t>(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < part; ++j)
      sum += p[i * part + j] = std::exp(in[i * part + j] - rowMax[static_cast<size_t>(i)]);
    sums[static_cast<size_t>(i)] = sum;
    const int64_t local = static_cast<int64_t>(target[static_cast<size_t>(i)]) - first;
    if (local >= 0 && local < part) targetLogit[static_cast<size_t>(i)] = in[i * part + local];
  }
  comm->allreduce(sums.data(), sums.data(), sums.size(), DType::F64, comm::ReduceOp::Sum);
  comm->allreduce(targetLogit.data(), targetLogit.data(), targetLogit.size(), DType::F64,
                  comm::ReduceOp::Sum);
  double loss = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const size_t r = static_cast<size_t>(i);
    loss += std::log(sums[r]) + rowMax[r] - targetLogit[r];
    for (int64_t j = 0; j < part; ++j)
      p[i * part + j] = static_cast<float>(p[i * part + j] / sums[r]);
  }
  Tensor out = Tensor::scalar(loss / static_cast<double>(rows), DType::F32);
  const Shape shape = logits.shape();
  return autograd::record(
      out, {logits}, "VocabParallelCrossEntropy",
      [probabilities, target, first, part, rows, shape](const Tensor& g) {
        // d loss / d logit = (softmax − one-hot) / N, this rank's classes.
        const float scale = static_cast<float>(g.item() / static_cast<double>(rows));
        Tensor grad = probabilities.clone();
        float* d = grad.data<float>();
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t local = static_cast<int64_t>(target[static_cast<size_t>(i)]) - first;
          if (local >= 0 && local < part) d[i * part + local] -= 1.0f;
        }
        for (int64_t k = 0; k < rows * part; ++k) d[k] *= scale;
        return std::vector<Tensor>{grad.reshape(shape)};
      });
}

}  // namespace kolo::parallel
