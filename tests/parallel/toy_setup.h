// Test helpers for the data-parallel tests: a small two-layer classifier written with the
// ops of kolo/ops.h, a deterministic synthetic data set, and a runner for ranks as threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/ops.h"
#include "kolo/parallel/reducer.h"
#include "kolo/tensor.h"

namespace kolo::parallel::testing {

inline constexpr int64_t kIn = 12;
inline constexpr int64_t kHidden = 16;
inline constexpr int64_t kClasses = 5;

/// Parameters of a 2-layer MLP in namedParameters() order (PyTorch names).
inline NamedTensors makeToyParameters(uint64_t seed) {
  Generator gen(seed);
  NamedTensors p;
  p.emplace_back("0.weight", Tensor::rand({kHidden, kIn}, gen, -0.3, 0.3));
  p.emplace_back("0.bias", Tensor::rand({kHidden}, gen, -0.3, 0.3));
  p.emplace_back("2.weight", Tensor::rand({kClasses, kHidden}, gen, -0.3, 0.3));
  p.emplace_back("2.bias", Tensor::rand({kClasses}, gen, -0.3, 0.3));
  for (auto& [n, t] : p) t.setRequiresGrad(true);
  return p;
}

/// Mean cross-entropy of the toy MLP on rows [lo, hi) of the data.
inline Tensor toyLoss(const NamedTensors& p, const Tensor& x, const Tensor& y) {
  Tensor h = relu(linear(x, p[0].second, p[1].second));
  return crossEntropy(linear(h, p[2].second, p[3].second), y);
}

struct ToyData {
  Tensor x;  // f32 [n, kIn]
  Tensor y;  // i64 [n]
  Tensor rows(int64_t lo, int64_t hi, bool labels) const {
    return (labels ? y : x).slice(0, lo, hi).contiguous();
  }
};

inline ToyData makeToyData(int64_t n, uint64_t seed = 7) {
  Generator gen(seed);
  ToyData d;
  d.x = Tensor::randn({n, kIn}, gen);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int64_t>(gen.nextU64() % kClasses);
  d.y = Tensor::fromVector({n}, labels);
  return d;
}

/// Copies of every parameter's gradient, flattened in order.
inline std::vector<double> flatGrads(const NamedTensors& p) {
  std::vector<double> out;
  for (const auto& [n, t] : p) {
    auto v = t.grad().toDoubleVector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

inline std::vector<double> flatValues(const NamedTensors& p) {
  std::vector<double> out;
  for (const auto& [n, t] : p) {
    auto v = t.toDoubleVector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

/// Runs fn(rank) on `k` threads and rethrows the first failure.
inline void runThreads(int k, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(k);
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Largest |a-b| over the largest |b| (relative to the scale of the reference), or a huge
/// value when the sizes differ.
inline double maxRelDiff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e30;
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace kolo::parallel::testing
