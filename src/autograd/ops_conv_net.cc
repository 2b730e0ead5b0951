// Differentiable ops of convolutional networks beyond convolution and max-pooling: batch
// normalisation (with its statistics optionally summed over a data-parallel group, as
// SyncBatchNorm does), alone or with a residual addition and the ReLU after it in one pass,
// and average pooling over fixed and adaptive windows.
#include <algorithm>
#include <cmath>

#include "kolo/ops.h"
#include "tensor/norm_pool.h"

namespace kolo {

using autograd::record;
using Grads = std::vector<Tensor>;

namespace {

bool req(const Tensor& t) { return t.defined() && t.requiresGrad(); }

void checkChannels(const Tensor& t, int64_t channels, const char* what) {
  KOLO_REQUIRE(!t.defined() || (t.dim() == 1 && t.size(0) == channels), "batchNorm: ", what, " ",
               shapeString(t.shape()), " does not match the input's ", channels, " channels");
}

// `values` (C) into the per-channel tensor `like` (its dtype and shape), in place.
void store(const Tensor& like, const std::vector<double>& values) {
  Tensor target = like;
  target.copyFrom(Tensor::fromVector({static_cast<int64_t>(values.size())}, values).to(like.dtype()));
}

// Per-channel statistics that a batch norm normalises with: the batch's (over the group when
// synchronised; the running estimates moved) in training, else the running ones (count 0).
struct Statistics {
  std::vector<double> mean, invstd;
  double count = 0.0;  // values per channel behind the statistics (0: the running ones)
};

Statistics statistics(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& runningMean,
                      const Tensor& runningVar, bool training, double momentum, double eps, const GroupSum& groupSum) {
  KOLO_REQUIRE(x.dim() >= 2, "batchNorm: input ", shapeString(x.shape()), " is not (N, C, ...)");
  const int64_t channels = x.size(1);
  checkChannels(weight, channels, "weight");
  checkChannels(bias, channels, "bias");
  checkChannels(runningMean, channels, "running mean");
  checkChannels(runningVar, channels, "running variance");
  const auto c = static_cast<size_t>(channels);
  Statistics st{std::vector<double>(c), std::vector<double>(c), 0.0};
  if (!training) {
    KOLO_REQUIRE(runningMean.defined() && runningVar.defined(),
                 "batchNorm: evaluation needs the running mean and variance");
    st.mean = runningMean.toDoubleVector();
    const std::vector<double> var = runningVar.toDoubleVector();
    for (size_t k = 0; k < c; ++k) st.invstd[k] = 1.0 / std::sqrt(var[k] + eps);
    return st;
  }
  const kernels::ChannelMoments local = kernels::channelMoments(x);
  std::vector<double> sum = local.sum, m2 = local.m2;
  double count = static_cast<double>(local.count);
  if (groupSum) {
    // The group's moments from each replica's count, sum and sum of squares about zero
    // (its own squared deviations plus sum^2 / count), added up in f64.
    std::vector<double> values(2 * c + 1);
    values[0] = count;
    for (size_t k = 0; k < c; ++k) {
      values[1 + k] = sum[k];
      values[1 + c + k] = m2[k] + (local.count > 0 ? sum[k] * sum[k] / count : 0.0);
    }
    groupSum(values);
    count = values[0];
    for (size_t k = 0; k < c; ++k) {
      sum[k] = values[1 + k];
      m2[k] = std::max(values[1 + c + k] - sum[k] * sum[k] / count, 0.0);
    }
  }
  KOLO_REQUIRE(count > 1, "batchNorm: training needs more than one value per channel, input is ",
               shapeString(x.shape()), groupSum ? " over the group" : "");
  std::vector<double> var(c);
  for (size_t k = 0; k < c; ++k) {
    st.mean[k] = sum[k] / count;
    var[k] = m2[k] / count;
    st.invstd[k] = 1.0 / std::sqrt(var[k] + eps);
  }
  if (runningMean.defined() && runningVar.defined()) {
    std::vector<double> rm = runningMean.toDoubleVector(), rv = runningVar.toDoubleVector();
    const double unbiased = count / (count - 1.0);
    for (size_t k = 0; k < c; ++k) {
      rm[k] = (1.0 - momentum) * rm[k] + momentum * st.mean[k];
      rv[k] = (1.0 - momentum) * rv[k] + momentum * var[k] * unbiased;
    }
    store(runningMean, rm);
    store(runningVar, rv);
  }
  st.count = count;
  return st;
}

// The parameters' gradients from the backward's sums (this replica's own: data parallelism
// averages them), then the sums made the group's for the input's gradient when the
// statistics were the group's.
void parameterGrads(const Statistics& st, std::vector<double>& sumG, std::vector<double>& sumGCentered, bool rw,
                    bool rb, bool rx, DType wtype, const GroupSum& groupSum, Tensor& gw, Tensor& gb) {
  const size_t c = sumG.size();
  const auto channels = static_cast<int64_t>(c);
  if (rw) {
    std::vector<double> values(c);
    for (size_t k = 0; k < c; ++k) values[k] = sumGCentered[k] * st.invstd[k];
    gw = Tensor::fromVector({channels}, values).to(wtype);
  }
  if (rb) gb = Tensor::fromVector({channels}, sumG).to(wtype);
  if (rx && st.count > 0 && groupSum) {
    std::vector<double> values(sumG);
    values.insert(values.end(), sumGCentered.begin(), sumGCentered.end());
    groupSum(values);
    std::copy(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(c), sumG.begin());
    std::copy(values.begin() + static_cast<std::ptrdiff_t>(c), values.end(), sumGCentered.begin());
  }
}

}  // namespace

Tensor batchNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& runningMean,
                 const Tensor& runningVar, bool training, double momentum, double eps, const GroupSum& groupSum) {
  const Statistics st = statistics(x, weight, bias, runningMean, runningVar, training, momentum, eps, groupSum);
  Tensor out = kernels::batchNormApply(x, st.mean, st.invstd, weight, bias);
  if (!autograd::needsRecord({&x, &weight, &bias})) return out;
  const bool rx = req(x), rw = req(weight), rb = req(bias);
  const Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor();
  const DType wtype = weight.defined() ? weight.dtype() : x.dtype();
  return record(out, {x, weight, bias}, "BatchNormBackward", [=](const Tensor& g) {
    std::vector<double> sumG, sumGCentered;
    kernels::batchNormGradSums(g, xd, st.mean, sumG, sumGCentered);
    Tensor gx, gw, gb;
    parameterGrads(st, sumG, sumGCentered, rw, rb, rx, wtype, groupSum, gw, gb);
    if (rx) gx = kernels::batchNormInputGrad(g, xd, st.mean, st.invstd, wd, sumG, sumGCentered, st.count);
    return Grads{gx, gw, gb};
  });
}

Tensor batchNormRelu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                     const Tensor& runningMean, const Tensor& runningVar, bool training, double momentum, double eps,
                     const GroupSum& groupSum) {
  KOLO_REQUIRE(!residual.defined() || residual.shape() == x.shape(), "batchNormRelu: residual ",
               shapeString(residual.shape()), " does not match the input ", shapeString(x.shape()));
  KOLO_REQUIRE(!residual.defined() || residual.dtype() == x.dtype(), "batchNormRelu: residual of ",
               dtypeName(residual.dtype()), " added to ", dtypeName(x.dtype()));
  const Statistics st = statistics(x, weight, bias, runningMean, runningVar, training, momentum, eps, groupSum);
  Tensor out = kernels::batchNormReluApply(x, st.mean, st.invstd, weight, bias, residual);
  if (!autograd::needsRecord({&x, &weight, &bias, &residual})) return out;
  const bool rx = req(x), rw = req(weight), rb = req(bias), rr = req(residual);
  // The output is where the ReLU passed its gradient (out > 0); the next layer keeps it anyway.
  const Tensor xd = x.detach(), wd = weight.defined() ? weight.detach() : Tensor(), outd = out.detach();
  const DType wtype = weight.defined() ? weight.dtype() : x.dtype();
  return record(out, {x, weight, bias, residual}, "BatchNormReluBackward", [=](const Tensor& g) {
    std::vector<double> sumG, sumGCentered;
    Tensor gx, gw, gb, gr;
    kernels::batchNormReluGradSums(g, outd, xd, st.mean, sumG, sumGCentered, rr ? &gr : nullptr);
    parameterGrads(st, sumG, sumGCentered, rw, rb, rx, wtype, groupSum, gw, gb);
    if (rx) gx = kernels::batchNormReluInputGrad(g, outd, xd, st.mean, st.invstd, wd, sumG, sumGCentered, st.count);
    return Grads{gx, gw, gb, gr};
  });
}

Tensor avgPool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  if (stride <= 0) stride = kernel;
  Tensor out = kernels::avgPool2dForward(x, kernel, stride, padding);
  if (!autograd::needsRecord({&x})) return out;
  const Shape shape = x.shape();
  return record(out, {x}, "AvgPool2dBackward", [shape, kernel, stride, padding](const Tensor& g) {
    return Grads{kernels::avgPool2dBackward(g, shape, kernel, stride, padding)};
  });
}

Tensor adaptiveAvgPool2d(const Tensor& x, int64_t outH, int64_t outW) {
  Tensor out = kernels::adaptiveAvgPool2dForward(x, outH, outW);
  if (!autograd::needsRecord({&x})) return out;
  const Shape shape = x.shape();
  return record(out, {x}, "AdaptiveAvgPool2dBackward", [shape](const Tensor& g) {
    return Grads{kernels::adaptiveAvgPool2dBackward(g, shape)};
  });
}

}  // namespace kolo
