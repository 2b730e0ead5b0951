// Tests of the backward engine: gradient-ready hook timing, accumulation across passes,
// zeroGrad keeping storage, no-grad scopes, shared subgraphs, and shape errors.
#include <gtest/gtest.h>

#include <cmath>

#include "kolo/ops.h"

namespace kolo {
namespace {

TEST(Engine, HookOfLastLayerFiresBeforeFirstLayerGradient) {
  Generator gen(1);
  Tensor w1 = Tensor::randn({8, 4}, gen).setRequiresGrad();
  Tensor w2 = Tensor::randn({8, 8}, gen).setRequiresGrad();
  Tensor w3 = Tensor::randn({3, 8}, gen).setRequiresGrad();
  std::vector<std::string> events;
  w3.addGradReadyHook([&](Tensor& g) {
    events.push_back("w3");
    // w1's gradient for this pass is not computed yet when the last layer's is final.
    EXPECT_FALSE(w1.grad().defined());
    EXPECT_EQ(g.shape(), w3.shape());
  });
  w2.addGradReadyHook([&](Tensor&) { events.push_back("w2"); });
  w1.addGradReadyHook([&](Tensor&) { events.push_back("w1"); });
  Tensor x = Tensor::randn({5, 4}, gen);
  Tensor loss = sum(linear(relu(linear(relu(linear(x, w1, Tensor())), w2, Tensor())), w3, Tensor()));
  loss.backward();
  EXPECT_EQ(events, (std::vector<std::string>{"w3", "w2", "w1"}));
}

TEST(Engine, HookWaitsForEveryPathOfASharedParameter) {
  Tensor w = Tensor::fromVector({2}, std::vector<float>{1, 2}).setRequiresGrad();
  int fired = 0;
  std::vector<float> seen;
  w.addGradReadyHook([&](Tensor& g) {
    ++fired;
    seen = g.toFloatVector();
  });
  // Used twice, far apart in the graph: the hook fires once, with the total.
  Tensor a = w * 3.0;
  Tensor b = exp(a) * 0.0 + w * w;
  sum(a + b).backward();
  EXPECT_EQ(fired, 1);
  // d/dw (3w + w^2) = 3 + 2w
  EXPECT_EQ(seen, (std::vector<float>{5, 7}));
}

TEST(Engine, GradientsAccumulateUntilZeroGradWhichKeepsStorage) {
  Tensor w = Tensor::fromVector({3}, std::vector<float>{1, 2, 3}).setRequiresGrad();
  sum(w * w).backward();
  EXPECT_EQ(w.grad().toFloatVector(), (std::vector<float>{2, 4, 6}));
  const void* storage = w.grad().rawData();
  sum(w * 2.0).backward();
  EXPECT_EQ(w.grad().toFloatVector(), (std::vector<float>{4, 6, 8}));
  w.zeroGrad();
  EXPECT_EQ(w.grad().toFloatVector(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(w.grad().rawData(), storage);
  sum(w).backward();
  EXPECT_EQ(w.grad().toFloatVector(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(w.grad().rawData(), storage);
}

TEST(Engine, RemovedHookDoesNotFire) {
  Tensor w = Tensor::ones({2}).setRequiresGrad();
  int fired = 0;
  int id = w.addGradReadyHook([&](Tensor&) { ++fired; });
  sum(w).backward();
  w.removeGradReadyHook(id);
  sum(w).backward();
  EXPECT_EQ(fired, 1);
}

TEST(Engine, NoGradGuardRecordsNothing) {
  Tensor w = Tensor::ones({2}).setRequiresGrad();
  {
    autograd::NoGradGuard guard;
    Tensor y = w * 2.0;
    EXPECT_FALSE(y.requiresGrad());
    EXPECT_TRUE(y.isLeaf());
    EXPECT_THROW(sum(y).backward(), InvalidArgument);
  }
  EXPECT_TRUE(autograd::isGradEnabled());
  Tensor y = w * 2.0;
  EXPECT_TRUE(y.requiresGrad());
  EXPECT_FALSE(y.isLeaf());
  EXPECT_FALSE(y.detach().requiresGrad());
}

TEST(Engine, BroadcastGradientsReduceToInputShape) {
  Tensor a = Tensor::ones({2, 3}).setRequiresGrad();
  Tensor b = Tensor::fromVector({3}, std::vector<float>{1, 2, 3}).setRequiresGrad();
  Tensor c = Tensor::full({2, 1}, 2.0).setRequiresGrad();
  Tensor y = a * b + c;
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  sum(y).backward();
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  EXPECT_EQ(b.grad().toFloatVector(), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(c.grad().shape(), (Shape{2, 1}));
  EXPECT_EQ(c.grad().toFloatVector(), (std::vector<float>{3, 3}));
  EXPECT_EQ(a.grad().toFloatVector(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

TEST(Engine, ViewsRecordBackward) {
  Tensor x = Tensor::fromVector({2, 3}, std::vector<float>{0, 1, 2, 3, 4, 5}).setRequiresGrad();
  Tensor s = x.slice(1, 1, 3).t().reshape({4});
  EXPECT_EQ(s.toFloatVector(), (std::vector<float>{1, 4, 2, 5}));
  sum(s * Tensor::fromVector({4}, std::vector<float>{1, 2, 3, 4})).backward();
  EXPECT_EQ(x.grad().toFloatVector(), (std::vector<float>{0, 1, 3, 0, 2, 4}));
}

TEST(Engine, ExplicitSeedAndErrors) {
  Tensor x = Tensor::ones({2}).setRequiresGrad();
  Tensor y = x * 3.0;
  EXPECT_THROW(y.backward(), InvalidArgument);  // not a scalar
  y.backward(Tensor::fromVector({2}, std::vector<float>{1, 2}));
  EXPECT_EQ(x.grad().toFloatVector(), (std::vector<float>{3, 6}));
  EXPECT_THROW(Tensor::ones({2}).backward(), InvalidArgument);
}

TEST(Engine, BackwardReusingItsIncomingGradientLeavesSharedOnesIntact) {
  // d/dx sum(relu(x) + x + relu(x) * 3) = [x > 0] * 4 + 1: the add nodes hand the same
  // gradient to a leaf and to both relus, so none of them may overwrite it.
  Tensor x = Tensor::fromVector({4}, std::vector<float>{-1, 2, -3, 4}).setRequiresGrad();
  sum(add(add(relu(x), x), mul(relu(x), Tensor::scalar(3.0)))).backward();
  EXPECT_EQ(x.grad().toFloatVector(), (std::vector<float>{1, 5, 1, 5}));
  // A seed the caller keeps must come back unchanged.
  Tensor y = Tensor::fromVector({3}, std::vector<float>{-1, 1, 2}).setRequiresGrad();
  Tensor seed = Tensor::fromVector({3}, std::vector<float>{7, 8, 9});
  relu(y).backward(seed);
  EXPECT_EQ(seed.toFloatVector(), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(y.grad().toFloatVector(), (std::vector<float>{0, 8, 9}));
}

TEST(Engine, PathsIntoOneNodeSumWithoutChangingAGradientAnotherPathHolds) {
  // s = u + 3u + u*u with u = 2x: ds/dx = 2 (4 + 2u) = 8 + 8x. The outer add hands one
  // gradient to u and to 3u, and u*u hands u two: each sum must leave the others' intact.
  Tensor x = Tensor::fromVector({3}, std::vector<float>{0.5f, -1.0f, 2.0f}).setRequiresGrad();
  Tensor u = mul(x, Tensor::scalar(2.0));
  sum(add(add(u, mul(u, Tensor::scalar(3.0))), mul(u, u))).backward();
  EXPECT_EQ(x.grad().toFloatVector(), (std::vector<float>{12.0f, 0.0f, 24.0f}));
}

TEST(Errors, WrongShapesNameBothShapes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  try {
    matmul(a, b);
    FAIL() << "matmul accepted mismatched shapes";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
  try {
    add(Tensor::zeros({2, 3}), Tensor::zeros({4}));
    FAIL() << "add accepted non-broadcastable shapes";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(conv2d(Tensor::zeros({1, 2, 5, 5}), Tensor::zeros({3, 1, 3, 3}), Tensor()), InvalidArgument);
  EXPECT_THROW(linear(Tensor::zeros({2, 5}), Tensor::zeros({3, 4}), Tensor()), InvalidArgument);
  EXPECT_THROW(add(Tensor::zeros({2}, DType::F16), Tensor::zeros({2})), InvalidArgument);
  EXPECT_THROW(crossEntropy(Tensor::zeros({2, 3}), Tensor::fromVector({2}, std::vector<int64_t>{0, 3})),
               InvalidArgument);
}

TEST(Ops, ClosedFormValues) {
  Tensor a = Tensor::fromVector({2, 2}, std::vector<float>{1, 2, 3, 4});
  Tensor b = Tensor::fromVector({2, 2}, std::vector<float>{5, 6, 7, 8});
  EXPECT_EQ(matmul(a, b).toFloatVector(), (std::vector<float>{19, 22, 43, 50}));
  EXPECT_EQ(matmul(a.t(), b).toFloatVector(), (std::vector<float>{26, 30, 38, 44}));
  EXPECT_EQ(sum(a, {0}).toFloatVector(), (std::vector<float>{4, 6}));
  EXPECT_EQ(mean(a, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(max(a, 1).toFloatVector(), (std::vector<float>{2, 4}));
  EXPECT_EQ(argmax(b, 0).toDoubleVector(), (std::vector<double>{1, 1}));
  std::vector<float> sm = softmax(Tensor::fromVector({2}, std::vector<float>{0, 0}), 0).toFloatVector();
  EXPECT_FLOAT_EQ(sm[0], 0.5f);
  // crossEntropy of uniform logits over C classes is log(C).
  Tensor loss = crossEntropy(Tensor::zeros({3, 4}), Tensor::fromVector({3}, std::vector<int64_t>{0, 1, 3}));
  EXPECT_NEAR(loss.item(), std::log(4.0), 1e-6);
  Tensor c = cat({a, b}, 0);
  EXPECT_EQ(c.shape(), (Shape{4, 2}));
  EXPECT_EQ(stack({a, b}, 0).shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(maskedFill(a, trilMask(2), 0.0).toFloatVector(), (std::vector<float>{0, 2, 0, 0}));
}

TEST(Ops, CrossEntropyOfASequenceTakesEveryPositionAsASample) {
  // Scores (B, T, C) against labels (B, T): the mean over every position, with the gradient
  // of the flattened (B*T, C) form.
  Generator gen(3);
  Tensor logits = Tensor::randn({2, 3, 5}, gen);
  logits.setRequiresGrad(true);
  const Tensor labels = Tensor::fromVector({2, 3}, std::vector<int64_t>{0, 4, 2, 1, 1, 3});
  Tensor flat = logits.detach().reshape({6, 5});
  flat.setRequiresGrad(true);
  const Tensor loss = crossEntropy(logits, labels);
  const Tensor expected = crossEntropy(flat, labels.reshape({6}));
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_FLOAT_EQ(static_cast<float>(loss.item()), static_cast<float>(expected.item()));
  loss.backward();
  expected.backward();
  EXPECT_EQ(logits.grad().reshape({6, 5}).toFloatVector(), flat.grad().toFloatVector());
  // Shapes that do not match are the caller's mistake, named in full.
  for (const auto& [scores, classes] : std::vector<std::pair<Shape, Shape>>{
           {{2, 3, 5}, {3, 2}}, {{2, 3, 5}, {6}}, {{6, 5}, {5}}, {{5}, {1}}}) {
    try {
      crossEntropy(Tensor::zeros(scores), Tensor::zeros(classes, DType::I64));
      FAIL() << "crossEntropy accepted logits " << shapeString(scores) << " with labels " << shapeString(classes);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(shapeString(scores)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(shapeString(classes)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kolo
