// Top-k sparsification with error feedback as a Reducer communication hook: each rank sends
// the indices and values of its k largest-magnitude elements (kolo/parallel/compression.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "kolo/error.h"
#include "kolo/parallel/compression.h"

namespace kolo::parallel::compression {
namespace {

// The k-th largest |x| of x[0, n). Selection over all n elements is the cost of the hook,
// so a strided sample of 8192 first gives a bound below which at most a few k elements
// lie above; the exact selection then runs over those candidates only (and over all of
// them when the sample misjudged and fewer than k qualify).
float kthLargestMagnitude(const float* x, size_t n, size_t k) {
  std::vector<float> candidates;
  constexpr size_t kSample = 8192;
  if (n >= 4 * kSample && k <= n / 8) {
    const size_t stride = n / kSample;
    std::vector<float> sample(kSample);
    for (size_t i = 0; i < kSample; ++i) sample[i] = std::fabs(x[i * stride]);
    // The sample's quantile for 2k elements (with some slack), as a lower bound.
    const size_t rank = std::min(kSample, (2 * k * kSample) / n + 8);
    std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                     sample.end(), std::greater<float>());
    const float bound = sample[rank - 1];
    for (size_t i = 0; i < n; ++i)
      if (std::fabs(x[i]) >= bound) candidates.push_back(std::fabs(x[i]));
  }
  if (candidates.size() < k) {
    candidates.resize(n);
    for (size_t i = 0; i < n; ++i) candidates[i] = std::fabs(x[i]);
  }
  std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   candidates.end(), std::greater<float>());
  return candidates[k - 1];
}

class TopKHook final : public CommHook {
 public:
  explicit TopKHook(TopKOptions options) : options_(options) {
    KOLO_REQUIRE(options_.fraction > 0.0 && options_.fraction <= 1.0,
                 "top-k: the fraction must be in (0, 1], got ", options_.fraction);
  }
  std::string name() const override {
    char text[48];
    std::snprintf(text, sizeof text, "topk:%g", options_.fraction);
    return text;
  }

  std::unique_ptr<comm::Work> run(const GradBucket& bucket) override {
    KOLO_REQUIRE(bucket.buffer.dtype() == DType::F32, "compression hook '", name(), "': bucket ",
                 bucket.index, " holds ", dtypeName(bucket.buffer.dtype()),
                 " gradients; only f32 is compressed");
    const size_t n = static_cast<size_t>(bucket.buffer.numel());
    if (n == 0) return completedWork();
    KOLO_REQUIRE(n <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), "top-k: bucket ",
                 bucket.index, " has ", n, " elements; indices are 32-bit (use smaller buckets)");
    Tensor buffer = bucket.buffer;  // a handle on the bucket's storage
    float* g = buffer.data<float>();
    if (options_.errorFeedback) {
      std::vector<float>& residual = residuals_[bucket.index];
      if (residual.empty()) residual.assign(n, 0.0f);
      KOLO_REQUIRE(residual.size() == n, "top-k: the residual of bucket ", bucket.index, " has ",
                   residual.size(), " elements, the bucket ", n);
      for (size_t i = 0; i < n; ++i) g[i] += residual[i];
    }
    // k is the same on every rank (the buckets are), so a fixed-size all-gather suffices.
    const size_t k = std::clamp<size_t>(
        static_cast<size_t>(std::ceil(options_.fraction * static_cast<double>(n))), 1, n);
    const float threshold = kthLargestMagnitude(g, n, k);
    size_t above = 0;
    for (size_t i = 0; i < n; ++i) above += std::fabs(g[i]) > threshold;
    size_t ties = k - std::min(above, k);
    std::vector<int32_t> order;
    order.reserve(k);
    for (size_t i = 0; i < n && order.size() < k; ++i) {
      const float x = std::fabs(g[i]);
      if (x > threshold || (x == threshold && ties > 0 && ties--))
        order.push_back(static_cast<int32_t>(i));
    }
    KOLO_CHECK_EQ(order.size(), k, "top-k: selection of bucket ", bucket.index,
                  " (a NaN gradient?)");
    std::vector<float> values(k);
    for (size_t t = 0; t < k; ++t) values[t] = g[order[t]];
    if (options_.errorFeedback) {
      std::vector<float>& residual = residuals_[bucket.index];
      std::copy(g, g + n, residual.begin());
      for (int32_t i : order) residual[static_cast<size_t>(i)] = 0.0f;
    }
    const size_t size = static_cast<size_t>(bucket.comm->size());
    std::vector<int32_t> allIndices(size * k);
    std::vector<float> allValues(size * k);
    countBytes(k * (sizeof(int32_t) + sizeof(float)));
    bucket.comm->allgather(order.data(), allIndices.data(), k, DType::I32, bucket.collective);
    bucket.comm->allgather(values.data(), allValues.data(), k, DType::F32, bucket.collective);
    std::fill(g, g + n, 0.0f);
    for (size_t t = 0; t < size * k; ++t) {
      const int32_t i = allIndices[t];
      KOLO_CHECK(i >= 0 && static_cast<size_t>(i) < n, "top-k: index ", i, " from rank ", t / k,
                 " is outside bucket ", bucket.index, " of ", n, " elements");
      g[i] += allValues[t];
    }
    return completedWork();
  }

  NamedTensors stateDict() const override {
    NamedTensors out;
    for (const auto& [index, residual] : residuals_)
      out.emplace_back("topk.bucket" + std::to_string(index) + ".residual",
                       Tensor::fromVector({static_cast<int64_t>(residual.size())}, residual));
    return out;
  }

  void loadStateDict(const NamedTensors& entries) override {
    std::map<size_t, std::vector<float>> residuals;
    const std::string prefix = "topk.bucket", suffix = ".residual";
    for (const auto& [name, tensor] : entries) {
      const bool named = name.size() > prefix.size() + suffix.size() &&
                         name.rfind(prefix, 0) == 0 &&
                         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
      KOLO_REQUIRE(named, "top-k state: unknown entry '", name, "'");
      const std::string digits =
          name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
      KOLO_REQUIRE(!digits.empty() && std::all_of(digits.begin(), digits.end(), ::isdigit),
                   "top-k state: bad entry name '", name, "'");
      KOLO_REQUIRE(tensor.dtype() == DType::F32, "top-k state: '", name, "' is ",
                   dtypeName(tensor.dtype()), ", expected f32");
      const float* v = tensor.data<float>();
      residuals[std::stoul(digits)].assign(v, v + tensor.numel());
    }
    residuals_ = std::move(residuals);
  }

 private:
  TopKOptions options_;
  std::map<size_t, std::vector<float>> residuals_;  // per bucket
};

}  // namespace

std::shared_ptr<CommHook> topKHook(TopKOptions options) {
  return std::make_shared<TopKHook>(options);
}

}  // namespace kolo::parallel::compression
