// Tests of what linear, matmul and conv2d keep for backward: each operand only for the
// gradient that reads it. A layer whose input needs no gradient (a first layer, fed by the
// data) holds no reference to its weight's memory, which fully sharded data parallelism
// relies on to skip gathering that weight for backward; the weight's gradient is unchanged.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

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

}  // namespace
}  // namespace kolo
