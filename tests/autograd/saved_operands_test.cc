// Tests of what linear, matmul and conv2d keep for backward: each operand only for the
// gradient that reads it. A layer whose input needs no gradient (a first layer, fed by the
// data) holds no reference to its weight's memory, which fully sharded data parallelism
// relies on to skip gathering that weight for backward; the weight's gradient is unchanged.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "kolo/memory.h"
#include "kolo/ops.h"

namespace kolo {
namespace {

// Handles to t's memory: its own and every view's (a detached operand kept by a node).
long memoryHolders(const Tensor& t) { return t.impl()->storage.use_count(); }

struct Layer {
  const char* name;
  Shape input;
  Shape weight;
  std::function<Tensor(const Tensor& x, const Tensor& w)> apply;
};

std::vector<Layer> layers() {
  return {
      {"linear", {3, 5}, {4, 5}, [](const Tensor& x, const Tensor& w) { return linear(x, w, Tensor()); }},
      {"matmul", {3, 5}, {5, 4}, [](const Tensor& x, const Tensor& w) { return matmul(x, w); }},
      {"conv2d", {2, 3, 6, 6}, {4, 3, 3, 3},
       [](const Tensor& x, const Tensor& w) { return conv2d(x, w, Tensor(), 1, 1); }},
  };
}

TEST(SavedOperands, ALayerWhoseInputNeedsNoGradientKeepsNoReferenceToItsWeight) {
  for (const Layer& layer : layers()) {
    Generator gen(7);
    Tensor w = Tensor::randn(layer.weight, gen).setRequiresGrad();
    const long before = memoryHolders(w);
    Tensor data = Tensor::randn(layer.input, gen);
    Tensor out = layer.apply(data, w);
    EXPECT_EQ(memoryHolders(w), before) << layer.name << ": the weight is kept although the input needs no gradient";

    // With an input that needs a gradient the weight is kept (dX reads it): the count can rise.
    Tensor input = data.clone().setRequiresGrad();
    Tensor both = layer.apply(input, w);
    EXPECT_GT(memoryHolders(w), before) << layer.name;

    // The weight's gradient is the same either way.
    sum(out).backward();
    const std::vector<float> alone = w.grad().toFloatVector();
    w.setGrad(Tensor());
    sum(both).backward();
    EXPECT_EQ(alone, w.grad().toFloatVector()) << layer.name;
    EXPECT_TRUE(input.grad().defined()) << layer.name;
  }
}

TEST(SavedOperands, AFrozenWeightIsKeptAndTheInputIsNot) {
  // The mirror case: a weight that needs no gradient, an input that does. The input's memory
  // is not kept (only dW reads it); the weight is.
  for (const Layer& layer : layers()) {
    Generator gen(8);
    Tensor w = Tensor::randn(layer.weight, gen);
    Tensor x = Tensor::randn(layer.input, gen).setRequiresGrad();
    const long inputBefore = memoryHolders(x), weightBefore = memoryHolders(w);
    Tensor out = layer.apply(x, w);
    EXPECT_EQ(memoryHolders(x), inputBefore) << layer.name;
    EXPECT_GT(memoryHolders(w), weightBefore) << layer.name;
    sum(out).backward();
    EXPECT_TRUE(x.grad().defined()) << layer.name;
  }
}

// ReLU keeps a bit per element for backward, not its output: once the output is dropped
// (a pooling layer keeps indices, a sum nothing), the graph holds an eighth of a byte per
// element; the gradient is still 1 where x > 0 and 0 elsewhere, odd lengths and strided
// gradients included.
TEST(SavedOperands, ReluKeepsABitPerElement) {
  for (int64_t n : {int64_t{1} << 16, int64_t{13}}) {
    Generator gen(3);
    Tensor x = Tensor::randn({n}, gen).setRequiresGrad();
    const int64_t before = liveTensorBytes();
    Tensor loss = sum(relu(x));
    const int64_t kept = liveTensorBytes() - before;
    EXPECT_LE(kept, (n + 7) / 8 + 256) << "n " << n;  // the mask and the loss, allocations rounded up
    loss.backward();
    const Tensor g = x.grad();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(g.data<float>()[i], x.data<float>()[i] > 0 ? 1.0f : 0.0f) << "element " << i;
  }
  Generator gen(4);
  Tensor x = Tensor::randn({6, 5}, gen).setRequiresGrad();
  Tensor w = Tensor::randn({6, 4}, gen);
  sum(matmul(relu(x).t(), w)).backward();  // the gradient reaching relu is strided
  Tensor expected = matmul(w, Tensor::ones({4, 5})).contiguous();
  for (int64_t i = 0; i < 30; ++i) {
    const float v = x.data<float>()[i] > 0 ? expected.data<float>()[i] : 0.0f;
    EXPECT_NEAR(x.grad().contiguous().data<float>()[i], v, 1e-5) << "element " << i;
  }
}

}  // namespace
}  // namespace kolo
