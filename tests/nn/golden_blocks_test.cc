// Golden comparison of the LLaMA-style blocks with PyTorch (tests/fixtures/make_golden_blocks.py):
// RMSNorm, SiLU, the SwiGLU MLP, rotary positions and causal attention with grouped and
// single key/value heads, forward and the gradient of every input and parameter, at odd shapes.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kolo/nn/llama.h"
#include "nn/golden_fixture.h"

namespace kolo {
namespace {

using golden::Record;
using golden::relativeError;
using golden::toTensor;

constexpr double kRelTol = 1e-5;

const std::map<std::string, Record>& fixture() {
  static const auto records =
      golden::readFixture(std::string(KOLO_SOURCE_DIR) + "/tests/fixtures/golden_blocks.bin");
  return records;
}

// Runs `fn` on the case's inputs (named `inputs`, leaves that require grad), backpropagates
// sum(y * dy) and compares y and each input's gradient with PyTorch's.
void expectCase(const std::string& prefix, const std::vector<std::string>& inputs,
                const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  std::vector<Tensor> leaves;
  for (const std::string& name : inputs) {
    leaves.push_back(toTensor(fixture().at(prefix + name), DType::F32));
    leaves.back().setRequiresGrad(true);
  }
  const Tensor y = fn(leaves);
  EXPECT_LE(relativeError(y, fixture().at(prefix + "y")), kRelTol) << prefix << "y";
  sum(y * toTensor(fixture().at(prefix + "dy"), DType::F32)).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(leaves[i].grad().defined()) << prefix << inputs[i];
    EXPECT_LE(relativeError(leaves[i].grad(), fixture().at(prefix + "grad/" + inputs[i])), kRelTol)
        << prefix << "gradient of " << inputs[i];
  }
}

// As expectCase for a module: the fixture's values go into its parameters (by name), whose
// gradients are compared too.
void expectModule(const std::string& prefix, nn::Module& module) {
  for (auto& [name, p] : module.namedParameters()) p.copyFrom(toTensor(fixture().at(prefix + name), DType::F32));
  Tensor x = toTensor(fixture().at(prefix + "x"), DType::F32);
  x.setRequiresGrad(true);
  const Tensor y = module(x);
  EXPECT_LE(relativeError(y, fixture().at(prefix + "y")), kRelTol) << prefix << "y";
  sum(y * toTensor(fixture().at(prefix + "dy"), DType::F32)).backward();
  EXPECT_LE(relativeError(x.grad(), fixture().at(prefix + "grad/x")), kRelTol) << prefix << "gradient of x";
  for (auto& [name, p] : module.namedParameters()) {
    ASSERT_TRUE(p.grad().defined()) << prefix << name;
    EXPECT_LE(relativeError(p.grad(), fixture().at(prefix + "grad/" + name)), kRelTol)
        << prefix << "gradient of " << name;
  }
}

TEST(GoldenBlocks, RMSNorm) {
  nn::RMSNorm norm(7);
  expectModule("rms/", norm);
}

TEST(GoldenBlocks, SiLU) {
  nn::SiLU act;
  expectCase("silu/", {"x"}, [&](const std::vector<Tensor>& v) { return act(v[0]); });
}

TEST(GoldenBlocks, SwiGLU) {
  Generator gen(0);
  nn::SwiGLU mlp(7, 11, gen);
  expectModule("mlp/", mlp);
}

TEST(GoldenBlocks, RotaryPositions) {
  expectCase("rope/", {"x"},
             [](const std::vector<Tensor>& v) { return rotaryEmbedding(v[0], 6, Rotary{.theta = 1e4, .offset = 3}); });
}

TEST(GoldenBlocks, GroupedQueryAttentionWithRotaryPositions) {
  expectCase("gqa/", {"q", "k", "v"},
             [](const std::vector<Tensor>& v) { return causalAttention(v[0], v[1], v[2], 4, Rotary{}); });
}

TEST(GoldenBlocks, MultiQueryAttention) {
  expectCase("mqa/", {"q", "k", "v"}, [](const std::vector<Tensor>& v) {
    return causalAttention(v[0], v[1], v[2], 6, Rotary{.theta = 500.0, .offset = 2});
  });
}

TEST(GoldenBlocks, MultiHeadAttentionWithoutRotation) {
  expectCase("mha/", {"q", "k", "v"},
             [](const std::vector<Tensor>& v) { return causalAttention(v[0], v[1], v[2], 2); });
}

TEST(GoldenBlocks, GroupedQueryAttentionModule) {
  Generator gen(0);
  nn::GroupedQueryAttention attn(10, 4, 2, 4, gen);
  EXPECT_EQ(attn.heads(), 4);
  EXPECT_EQ(attn.kvHeads(), 2);
  EXPECT_EQ(attn.headDim(), 4);
  expectModule("attn/", attn);
}

}  // namespace
}  // namespace kolo
