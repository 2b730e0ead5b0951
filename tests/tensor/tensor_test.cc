// Tests of the raw tensor layer: factories, metadata, element access, copies, dtype
// conversion, views and their strides, the generator.
#include <gtest/gtest.h>

#include "kolo/tensor.h"

namespace kolo {
namespace {

TEST(TensorBasics, FactoriesAndMetadata) {
  Tensor z = Tensor::zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.nbytes(), 24u);
  EXPECT_EQ(z.dtype(), DType::F32);
  EXPECT_TRUE(z.isContiguous());
  EXPECT_EQ(z.size(-1), 3);
  for (float v : z.toFloatVector()) EXPECT_EQ(v, 0.0f);
  Tensor f = Tensor::full({4}, 2.5, DType::F64);
  EXPECT_EQ(f.toDoubleVector(), (std::vector<double>{2.5, 2.5, 2.5, 2.5}));
  EXPECT_DOUBLE_EQ(Tensor::scalar(3.0).item(), 3.0);
  EXPECT_EQ(Tensor::arange(4).toFloatVector(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_THROW(Tensor::fromVector({2, 2}, std::vector<float>{1, 2, 3}), InvalidArgument);
  EXPECT_THROW(z.data<double>(), InvalidArgument);
  EXPECT_THROW(z.item(), InvalidArgument);
}

TEST(TensorBasics, CloneCopyFillAreIndependent) {
  Tensor a = Tensor::fromVector({3}, std::vector<float>{1, 2, 3});
  Tensor b = a.clone();
  b.fill(7);
  EXPECT_EQ(a.toFloatVector(), (std::vector<float>{1, 2, 3}));
  Tensor shared = a;
  shared.data<float>()[0] = 9;
  EXPECT_EQ(a.toFloatVector()[0], 9.0f);
  a.copyFrom(Tensor::fromVector({3}, std::vector<double>{4, 5, 6}));
  EXPECT_EQ(a.toFloatVector(), (std::vector<float>{4, 5, 6}));
  EXPECT_THROW(a.copyFrom(Tensor::zeros({4})), InvalidArgument);
}

TEST(TensorBasics, HalfConversionsRoundTrip) {
  Tensor a = Tensor::fromVector({4}, std::vector<float>{1.0f, -2.5f, 0.1f, 65504.0f});
  Tensor h = a.to(DType::F16);
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(h.nbytes(), 8u);
  std::vector<float> back = h.to(DType::F32).toFloatVector();
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_NEAR(back[2], 0.1f, 1e-4);
  EXPECT_EQ(back[3], 65504.0f);
  std::vector<float> bf = a.to(DType::BF16).toFloatVector();
  EXPECT_EQ(bf[0], 1.0f);
  EXPECT_NEAR(bf[2], 0.1f, 1e-3);
  Tensor i = Tensor::fromVector({2}, std::vector<int64_t>{3, -4});
  EXPECT_EQ(i.to(DType::F32).toFloatVector(), (std::vector<float>{3, -4}));
}

TEST(TensorViews, TransposeSliceExpandReshape) {
  Tensor a = Tensor::fromVector({2, 3}, std::vector<float>{0, 1, 2, 3, 4, 5});
  Tensor t = a.t();
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{1, 3}));
  EXPECT_FALSE(t.isContiguous());
  EXPECT_EQ(t.toFloatVector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(t.contiguous().isContiguous());
  EXPECT_EQ(t.reshape({6}).toFloatVector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(t.view({6}), InvalidArgument);
  Tensor s = a.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.storageOffset(), 1);
  EXPECT_EQ(s.toFloatVector(), (std::vector<float>{1, 2, 4, 5}));
  Tensor stepped = a.slice(1, 0, 3, 2);
  EXPECT_EQ(stepped.toFloatVector(), (std::vector<float>{0, 2, 3, 5}));
  Tensor row = Tensor::fromVector({1, 3}, std::vector<float>{1, 2, 3});
  Tensor e = row.expand({2, 3});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.toFloatVector(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_THROW(a.expand({3, 3}), InvalidArgument);
  EXPECT_EQ(a.reshape({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_THROW(a.reshape({4, -1}), InvalidArgument);
  EXPECT_EQ(a.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(a.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3}));
  Tensor p = Tensor::zeros({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (std::vector<int64_t>{1, 12, 4}));
  EXPECT_EQ(Tensor::zeros({2, 3, 4}).flatten(1).shape(), (Shape{2, 12}));
  // Views share storage: writing through a slice changes the source.
  s.fill(-1);
  EXPECT_EQ(a.toFloatVector(), (std::vector<float>{0, -1, -1, 3, -1, -1}));
}

TEST(Generator, DeterministicAndRestorable) {
  Generator g1(42), g2(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(g1.nextU64(), g2.nextU64());
  auto state = g1.state();
  double u = g1.uniform();
  g2.setState(state);
  EXPECT_EQ(g2.uniform(), u);
  double mean = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double v = g1.normal();
    mean += v;
    sq += v * v;
  }
  mean /= n;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
  Tensor r = Tensor::rand({1000}, g1, -2.0, 3.0);
  for (float v : r.toFloatVector()) {
    EXPECT_GE(v, -2.0f);
    EXPECT_LT(v, 3.0f);
  }
}

// This binary links the tensor layer alone. A tensor's autograd slot works without the
// autograd layer; recording a view or running backward needs it, and says so.
TEST(TensorWithoutAutograd, GradSlotWorksAndRecordingNamesTheMissingLayer) {
  Tensor w = Tensor::ones({2, 3});
  w.setName("w");
  w.setRequiresGrad();
  EXPECT_TRUE(w.requiresGrad());
  EXPECT_TRUE(w.isLeaf());
  w.setGrad(Tensor::full({2, 3}, 2.0));
  w.zeroGrad();
  EXPECT_EQ(w.grad().toFloatVector(), std::vector<float>(6, 0.0f));
  EXPECT_FALSE(w.detach().requiresGrad());
  // Views of tensors that need no gradient do not need the autograd layer.
  EXPECT_EQ(w.detach().reshape({3, 2}).shape(), (Shape{3, 2}));
  try {
    (void)w.reshape({3, 2});
    FAIL() << "recording a view without the autograd layer should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("autograd layer is not linked"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.backward(Tensor::ones({2, 3})), Error);
}

}  // namespace
}  // namespace kolo
