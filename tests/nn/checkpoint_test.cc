// Activation checkpointing (nn::checkpoint, Sequential::setRecompute): the same gradients
// bit for bit as the plain forward, each parameter's gradient-ready hook once per backward,
// less memory kept between forward and backward, and a block that computes differently the
// second time (Dropout) refused by name.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/nn/nn.h"
#include "kolo/ops.h"

namespace kolo {
namespace {

// Four blocks of LayerNorm, Linear 64 -> 256, GELU, Linear 256 -> 64 (wide activations
// inside, a narrow input to keep), then a head.
std::shared_ptr<nn::Sequential> model(uint64_t seed, double dropout = 0.0) {
  Generator gen(seed);
  auto net = std::make_shared<nn::Sequential>();
  for (int b = 0; b < 4; ++b) {
    auto block = std::make_shared<nn::Sequential>();
    block->add(std::make_shared<nn::LayerNorm>(Shape{64}));
    block->add(std::make_shared<nn::Linear>(64, 256, gen));
    block->add(std::make_shared<nn::GELU>());
    if (dropout > 0) block->add(std::make_shared<nn::Dropout>(dropout, seed));
    block->add(std::make_shared<nn::Linear>(256, 64, gen));
    net->add(block);
  }
  net->add(std::make_shared<nn::Linear>(64, 10, gen));
  return net;
}

struct Pass {
  int64_t keptBytes = 0;  // alive between forward and backward, beyond the input
  int hooks = 0;          // gradient-ready hooks fired
};

Pass trainStep(nn::Sequential& net, const Tensor& x) {
  Pass pass;
  std::vector<int> ids;
  for (Tensor& p : net.parameters()) {
    p.zeroGrad();
    ids.push_back(p.addGradReadyHook([&pass](Tensor&) { ++pass.hooks; }));
  }
  const int64_t before = liveTensorBytes();
  Tensor y = net(x);
  Tensor loss = sum(mul(y, y));
  pass.keptBytes = liveTensorBytes() - before;
  loss.backward();
  size_t i = 0;
  for (Tensor& p : net.parameters()) p.removeGradReadyHook(ids[i++]);
  return pass;
}

TEST(ActivationCheckpoint, RecomputedBlocksGiveTheSameGradientsAndKeepLess) {
  for (const bool inputNeedsGrad : {false, true}) {
    Generator gen(9);
    Tensor x = Tensor::randn({32, 64}, gen);
    Tensor x2 = x.clone();
    if (inputNeedsGrad) {
      x.setRequiresGrad();
      x2.setRequiresGrad();
    }
    auto plain = model(1), recomputed = model(1);
    recomputed->setRecompute(true);
    const Pass a = trainStep(*plain, x), b = trainStep(*recomputed, x2);
    const auto pa = plain->namedParameters(), pb = recomputed->namedParameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      const Tensor ga = pa[i].second.grad().contiguous(), gb = pb[i].second.grad().contiguous();
      ASSERT_EQ(ga.numel(), gb.numel());
      for (int64_t k = 0; k < ga.numel(); ++k)
        ASSERT_EQ(ga.data<float>()[k], gb.data<float>()[k]) << pa[i].first << " element " << k;
    }
    if (inputNeedsGrad) {
      for (int64_t k = 0; k < x.numel(); ++k) ASSERT_EQ(x.grad().data<float>()[k], x2.grad().data<float>()[k]);
    }
    EXPECT_EQ(a.hooks, static_cast<int>(pa.size()));
    EXPECT_EQ(b.hooks, static_cast<int>(pb.size()));
    // The plain forward keeps each block's 32 x 256 activations; recomputation its input.
    EXPECT_LT(b.keptBytes * 3, a.keptBytes) << "plain " << a.keptBytes << ", recomputed " << b.keptBytes;
  }
}

TEST(ActivationCheckpoint, ABlockThatComputesDifferentlyAgainIsRefusedByName) {
  auto net = model(2, 0.5);
  net->setRecompute(true);
  Generator gen(3);
  Tensor loss = sum((*net)(Tensor::randn({8, 64}, gen)));
  try {
    loss.backward();
    FAIL() << "a recomputed Dropout went unnoticed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("recomputing Sequential gave another output"), std::string::npos)
        << e.what();
  }
  // Out of training mode the Dropout is the identity: recomputation is exact again.
  net->train(false);
  sum((*net)(Tensor::randn({8, 64}, gen))).backward();
}

}  // namespace
}  // namespace kolo
