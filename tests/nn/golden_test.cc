// Golden comparisons with PyTorch: the built-in mlp and cnn, from closed-form weights on
// 8 Fashion-MNIST images, must reproduce PyTorch's logits, every parameter gradient, and
// the losses of 5 SGD(momentum 0.9) steps (fixtures from tests/fixtures/make_golden.py).
#include <gtest/gtest.h>

#include <cmath>

#include "kolo/nn/nn.h"
#include "nn/golden_fixture.h"

namespace kolo {
namespace {

using golden::readFixture;
using golden::Record;
using golden::relativeError;
using golden::toTensor;

constexpr double kRelTol = 1e-4;

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Same closed form as fixture_weight() in make_golden.py.
void setFixtureWeights(nn::Module& model) {
  int64_t index = 0, fanIn = 1;
  for (auto& [name, p] : model.namedParameters()) {
    if (p.dim() > 1) fanIn = p.numel() / p.shape()[0];
    const double bound = 1.0 / std::sqrt(static_cast<double>(fanIn));
    float* w = p.data<float>();
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double u = static_cast<double>(splitmix64((static_cast<uint64_t>(index) << 32) + i) >> 11) * 0x1.0p-53;
      w[i] = static_cast<float>((2.0 * u - 1.0) * bound);
    }
    ++index;
  }
}

void checkModel(const std::string& name, double lr) {
  auto fixture = readFixture(std::string(KOLO_SOURCE_DIR) + "/tests/fixtures/golden_" + name + ".bin");
  Generator gen(0);
  auto model = nn::makeModel(name, gen);
  setFixtureWeights(*model);
  Tensor x = toTensor(fixture.at("input"), DType::F32);
  Tensor y = toTensor(fixture.at("labels"), DType::I64);
  const Record& losses = fixture.at("losses");
  auto params = model->namedParameters();
  std::vector<Tensor> momentum(params.size());
  for (int step = 0; step < static_cast<int>(losses.values.size()); ++step) {
    model->zeroGrad();
    Tensor out = model->forward(x);
    Tensor loss = crossEntropy(out, y);
    loss.backward();
    EXPECT_NEAR(loss.item(), losses.values[step], kRelTol * std::abs(losses.values[step]))
        << name << " loss at step " << step;
    if (step == 0) {
      EXPECT_LE(relativeError(out, fixture.at("output")), kRelTol) << name << " forward output";
      for (auto& [pname, p] : params) {
        ASSERT_TRUE(p.grad().defined()) << pname;
        EXPECT_LE(relativeError(p.grad(), fixture.at("grad/" + pname)), kRelTol) << name << " grad of " << pname;
      }
    }
    // SGD with momentum as torch.optim.SGD: buf = g (first step), buf = 0.9 buf + g; p -= lr buf.
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& p = params[i].second;
      const float* g = p.grad().data<float>();
      if (!momentum[i].defined()) momentum[i] = p.grad().clone();
      else {
        float* b = momentum[i].data<float>();
        for (int64_t j = 0; j < p.numel(); ++j) b[j] = 0.9f * b[j] + g[j];
      }
      const float* b = momentum[i].data<float>();
      float* w = p.data<float>();
      for (int64_t j = 0; j < p.numel(); ++j) w[j] -= static_cast<float>(lr) * b[j];
    }
  }
}

TEST(Golden, MlpMatchesPyTorch) { checkModel("mlp", 0.05); }
TEST(Golden, CnnMatchesPyTorch) { checkModel("cnn", 0.02); }

}  // namespace
}  // namespace kolo
