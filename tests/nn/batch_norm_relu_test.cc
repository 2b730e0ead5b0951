// batchNormRelu, batch norm with the residual addition and ReLU after it as one op, against the
// three ops it replaces (values, every gradient, running statistics; f32 and f64, planes whose
// size is not a multiple of the kernels' lanes), its finite-difference check in f64, and the
// resnet's BasicBlock, which takes it unless a hook is registered on a batch norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autograd/gradcheck.h"
#include "kolo/nn/nn.h"
#include "nn/golden_fixture.h"

namespace kolo {
namespace {

using golden::relativeDifference;

struct Inputs {
  Tensor x, residual, weight, bias, runningMean, runningVar, upstream;
};

Inputs makeInputs(const Shape& shape, DType dtype, bool withResidual, uint64_t seed) {
  Generator gen(seed);
  const int64_t c = shape[1];
  Inputs in;
  in.x = Tensor::randn(shape, gen, 0.3, 1.5).to(dtype).clone().setRequiresGrad(true);
  if (withResidual) in.residual = Tensor::randn(shape, gen).to(dtype).clone().setRequiresGrad(true);
  in.weight = Tensor::rand({c}, gen, 0.5, 1.5).to(dtype).clone().setRequiresGrad(true);
  in.bias = Tensor::rand({c}, gen, -0.5, 0.5).to(dtype).clone().setRequiresGrad(true);
  in.runningMean = Tensor::rand({c}, gen, -0.2, 0.2).to(dtype).clone();
  in.runningVar = Tensor::rand({c}, gen, 0.5, 1.5).to(dtype).clone();
  in.upstream = Tensor::randn(shape, gen).to(dtype).clone();
  return in;
}

TEST(BatchNormRelu, EqualsBatchNormThenAdditionThenRelu) {
  for (const Shape& shape : {Shape{3, 4, 7, 7}, Shape{5, 3, 9}, Shape{2, 2, 4, 4}})
    for (DType dtype : {DType::F32, DType::F64})
      for (bool withResidual : {true, false})
        for (bool training : {true, false}) {
          SCOPED_TRACE(shapeString(shape) + " " + dtypeName(dtype) +
                       (withResidual ? " residual" : "") + (training ? " training" : " eval"));
          Inputs fused = makeInputs(shape, dtype, withResidual, 5),
                 apart = makeInputs(shape, dtype, withResidual, 5);
          Tensor y = batchNormRelu(fused.x, fused.residual, fused.weight, fused.bias,
                                   fused.runningMean, fused.runningVar, training);
          Tensor z = batchNorm(apart.x, apart.weight, apart.bias, apart.runningMean,
                               apart.runningVar, training);
          Tensor yApart = relu(withResidual ? z + apart.residual : z);
          sum(y * fused.upstream).backward();
          sum(yApart * apart.upstream).backward();
          const double tol = dtype == DType::F64 ? 1e-12 : 1e-6;
          EXPECT_LE(relativeDifference(y, yApart), tol) << "output";
          EXPECT_LE(relativeDifference(fused.x.grad(), apart.x.grad()), tol) << "input gradient";
          EXPECT_LE(relativeDifference(fused.weight.grad(), apart.weight.grad()), tol)
              << "weight gradient";
          EXPECT_LE(relativeDifference(fused.bias.grad(), apart.bias.grad()), tol)
              << "bias gradient";
          if (withResidual) {
            EXPECT_LE(relativeDifference(fused.residual.grad(), apart.residual.grad()), tol)
                << "residual gradient";
          }
          EXPECT_LE(relativeDifference(fused.runningMean, apart.runningMean), tol)
              << "running mean";
          EXPECT_LE(relativeDifference(fused.runningVar, apart.runningVar), tol)
              << "running variance";
        }
}

TEST(BatchNormRelu, GradcheckInF64) {
  for (bool training : {true, false}) {
    Inputs in = makeInputs({2, 3, 3, 5}, DType::F64, true, 9);
    testing::gradcheck(
        [&](const std::vector<Tensor>&) {
          return batchNormRelu(in.x, in.residual, in.weight, in.bias, in.runningMean, in.runningVar,
                               training,
                               /*momentum=*/0.0);
        },
        {in.x, in.residual, in.weight, in.bias});
  }
}

TEST(BatchNormRelu, RefusesAResidualOfAnotherShape) {
  Inputs in = makeInputs({2, 3, 4, 4}, DType::F32, false, 1);
  EXPECT_THROW(batchNormRelu(in.x, Tensor::zeros({2, 3, 4, 5}), in.weight, in.bias, in.runningMean,
                             in.runningVar, true),
               InvalidArgument);
  EXPECT_THROW(batchNormRelu(in.x, Tensor::zeros({2, 3, 4, 4}, DType::F64), in.weight, in.bias,
                             in.runningMean, in.runningVar, true),
               InvalidArgument);
}

// The block's output, every parameter's gradient and every buffer after one forward and
// backward in training mode.
std::vector<Tensor> blockStep(nn::BasicBlock& block, const Tensor& x0, const Tensor& upstream) {
  Tensor x = x0.clone().setRequiresGrad(true);
  Tensor y = block(x);
  sum(y * upstream).backward();
  std::vector<Tensor> out{y.detach(), x.grad()};
  for (auto& p : block.parameters()) out.push_back(p.grad());
  for (auto& [name, b] : block.namedBuffers()) out.push_back(b);
  return out;
}

TEST(BatchNormRelu, BasicBlockFusedEqualsItsStepsApart) {
  for (int64_t stride : {1, 2}) {
    Generator gen(3), genHooked(3);
    nn::BasicBlock fused(4, 6, stride, gen), hooked(4, 6, stride, genHooked);
    int calls = 0;
    hooked.bn2->addForwardHook(
        [&](nn::Module&, const Tensor&) { ++calls; });  // forces the steps apart
    Generator data(11);
    const Tensor x = Tensor::randn({3, 4, 9, 9}, data);
    const Tensor upstream = Tensor::randn({3, 6, stride == 1 ? 9 : 5, stride == 1 ? 9 : 5}, data);
    const std::vector<Tensor> a = blockStep(fused, x, upstream), b = blockStep(hooked, x, upstream);
    EXPECT_EQ(calls, 1);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_LE(relativeDifference(a[i], b[i]), 1e-6) << "entry " << i;
  }
}

}  // namespace
}  // namespace kolo
