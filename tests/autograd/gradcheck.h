// Finite-difference gradient checking in f64: compares the gradients that backward()
// produces for each input with central differences of a random projection of the output.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "kolo/ops.h"

namespace kolo::testing {

/// Checks d(sum(fn(inputs) * R))/d(input) for every input that requires grad, R fixed random.
inline void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, std::vector<Tensor> inputs,
                      double eps = 1e-6, double tol = 1e-5) {
  for (auto& t : inputs) ASSERT_EQ(t.dtype(), DType::F64);
  Generator gen(123);
  Tensor out0 = fn(inputs);
  Tensor proj = Tensor::randn(out0.shape(), gen, 0.0, 1.0, DType::F64);
  auto objective = [&](const std::vector<Tensor>& in) {
    autograd::NoGradGuard guard;
    return sum(mul(fn(in), proj)).item();
  };
  for (auto& t : inputs) t.zeroGrad();
  sum(mul(fn(inputs), proj)).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requiresGrad()) continue;
    Tensor g = inputs[i].grad();
    ASSERT_TRUE(g.defined()) << "input " << i << " got no gradient";
    std::vector<double> analytic = g.toDoubleVector();
    double* p = inputs[i].data<double>();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + eps;
      const double up = objective(inputs);
      p[j] = saved - eps;
      const double down = objective(inputs);
      p[j] = saved;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(analytic[j], numeric, tol * (1.0 + std::abs(numeric)))
          << "input " << i << " element " << j;
    }
  }
}

/// A random f64 leaf that requires grad.
inline Tensor leaf(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Generator gen(seed);
  Tensor t = Tensor::rand(shape, gen, low, high, DType::F64);
  t.setRequiresGrad(true);
  return t;
}

}  // namespace kolo::testing
