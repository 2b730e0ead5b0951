// Kernels of the convolutional networks' layers beyond convolution and max-pooling: batch
// normalisation per channel of (N, C, ...) inputs, and average pooling over fixed and
// adaptive windows. Nothing here records gradients; src/autograd/ops_conv_net.cc wraps them.
#pragma once

#include <cstdint>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::kernels {

/// Per-channel moments of an (N, C, ...) input: the values per channel, each channel's sum,
/// and its sum of squared deviations from the channel's own mean (f64 sums; planes of 16 or
/// more values read from memory once, each plane's squares about its own mean combined).
struct ChannelMoments {
  int64_t count = 0;
  std::vector<double> sum, m2;
};
ChannelMoments channelMoments(const Tensor& x);

/// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c] for an (N, C, ...) input; weight and
/// bias may be undefined (1 and 0).
Tensor batchNormApply(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& invstd,
                      const Tensor& weight, const Tensor& bias);

/// Per channel of the gradient g of an (N, C, ...) output: sum of g and sum of g (x - mean).
void batchNormGradSums(const Tensor& g, const Tensor& x, const std::vector<double>& mean, std::vector<double>& sumG,
                       std::vector<double>& sumGCentered);

/// The input's gradient: g w invstd, less (when count > 0, batch statistics) w invstd
/// (sumG + (x - mean) invstd^2 sumGCentered) / count, the sums and count over the batch the
/// statistics came from.
Tensor batchNormInputGrad(const Tensor& g, const Tensor& x, const std::vector<double>& mean,
                          const std::vector<double>& invstd, const Tensor& weight, const std::vector<double>& sumG,
                          const std::vector<double>& sumGCentered, double count);

/// relu(batchNormApply(x, ...) + residual), residual (x's shape) optional: one pass.
Tensor batchNormReluApply(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& invstd,
                          const Tensor& weight, const Tensor& bias, const Tensor& residual);

/// batchNormGradSums of the gradient through the ReLU of batchNormReluApply, gz = g where its
/// output `out` > 0, else 0; gz itself (the residual's gradient) into *gradZ when given.
void batchNormReluGradSums(const Tensor& g, const Tensor& out, const Tensor& x, const std::vector<double>& mean,
                           std::vector<double>& sumG, std::vector<double>& sumGCentered, Tensor* gradZ);

/// batchNormInputGrad of that gradient through the ReLU, from g and `out` in the same pass.
Tensor batchNormReluInputGrad(const Tensor& g, const Tensor& out, const Tensor& x, const std::vector<double>& mean,
                              const std::vector<double>& invstd, const Tensor& weight, const std::vector<double>& sumG,
                              const std::vector<double>& sumGCentered, double count);

/// Average pooling of (N, C, H, W) with a square kernel, counting the zero padding in the
/// divisor (PyTorch's count_include_pad default); the output floor((H + 2p - k) / s) + 1.
Tensor avgPool2dForward(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
Tensor avgPool2dBackward(const Tensor& grad, const Shape& xShape, int64_t kernel, int64_t stride, int64_t padding);

/// Adaptive average pooling of (N, C, H, W) to (N, C, outH, outW): output row i averages
/// input rows [floor(i H / outH), ceil((i + 1) H / outH)), columns alike (PyTorch's bins).
Tensor adaptiveAvgPool2dForward(const Tensor& x, int64_t outH, int64_t outW);
Tensor adaptiveAvgPool2dBackward(const Tensor& grad, const Shape& xShape);

}  // namespace kolo::kernels
