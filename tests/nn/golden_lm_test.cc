// Golden comparison of the `lm` with PyTorch: the twin of bench/peers/torch_lm.py (2 blocks,
// C 24, 3 heads, T 16), from PyTorch's initial weights, over 5 AdamW steps on the file-order
// batches of the GPL-3 text must give PyTorch's logits, every gradient of the first step, the
// loss of every step and every weight after the last (tests/fixtures/make_golden_lm.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "kolo/byte_corpus.h"
#include "kolo/nn/language_model.h"
#include "kolo/optim.h"
#include "nn/golden_fixture.h"

namespace kolo {
namespace {

using golden::Record;
using golden::relativeError;
using golden::toTensor;

// Relative to the largest magnitude of each tensor (loss: to the loss itself).
constexpr double kRelTol = 1e-4;
constexpr const char* kText = "/usr/share/common-licenses/GPL-3";

std::map<std::string, Record> lmFixture() {
  return golden::readFixture(std::string(KOLO_SOURCE_DIR) + "/tests/fixtures/golden_lm.bin");
}

int64_t configAt(const std::map<std::string, Record>& fixture, size_t i) {
  return static_cast<int64_t>(fixture.at("config").values.at(i));
}

// Step `step`'s slice of an i64 record (steps, B, T).
Tensor batchAt(const Record& r, int64_t step) {
  return toTensor(r, DType::I64).slice(0, step, step + 1).reshape({r.shape[1], r.shape[2]}).contiguous();
}

TEST(GoldenLm, MatchesPyTorchOverAdamWSteps) {
  const auto fixture = lmFixture();
  const nn::LanguageModelConfig config{.vocab = 256,
                                       .layers = configAt(fixture, 0),
                                       .dModel = configAt(fixture, 1),
                                       .heads = configAt(fixture, 2),
                                       .seqLen = configAt(fixture, 3)};
  const int64_t steps = configAt(fixture, 5);
  Generator gen(0);
  auto model = nn::makeLanguageModel(config, gen);
  auto params = model->namedParameters();
  int64_t initRecords = 0;
  for (const auto& entry : fixture) initRecords += entry.first.rfind("init/", 0) == 0;
  ASSERT_EQ(static_cast<int64_t>(params.size()), initRecords) << "the twin's parameters differ from kolo's";
  for (auto& [name, p] : params) {
    const Record& init = fixture.at("init/" + name);
    ASSERT_EQ(p.shape(), init.shape) << name;
    p.copyFrom(toTensor(init, DType::F32));
  }
  const std::vector<double>& hyper = fixture.at("hyper").values;
  // The fixture holds the hyper-parameters as f32; these are the values PyTorch used.
  ASSERT_NEAR(hyper[0], 1e-2, 1e-9);
  ASSERT_NEAR(hyper[1], 0.1, 1e-8);
  auto optimizer = optim::makeAdamW(params, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                             .weightDecay = 0.1});
  const std::vector<double>& losses = fixture.at("losses").values;
  ASSERT_EQ(static_cast<int64_t>(losses.size()), steps);
  for (int64_t step = 0; step < steps; ++step) {
    optimizer->zeroGrad();
    const Tensor logits = model->forward(batchAt(fixture.at("inputs"), step));
    Tensor loss = nn::languageModelLoss(logits, batchAt(fixture.at("labels"), step));
    loss.backward();
    EXPECT_NEAR(loss.item(), losses[step], kRelTol * std::abs(losses[step])) << "loss at step " << step;
    if (step == 0) {
      EXPECT_LE(relativeError(logits, fixture.at("logits")), kRelTol) << "logits";
      for (auto& [name, p] : params) {
        ASSERT_TRUE(p.grad().defined()) << name;
        EXPECT_LE(relativeError(p.grad(), fixture.at("grad/" + name)), kRelTol) << "gradient of " << name;
        if (name.ends_with("attn.qkv.bias")) {
          const std::vector<double> g = p.grad().toDoubleVector();
          const double largest = std::abs(*std::max_element(g.begin(), g.end(), [](double a, double b) {
            return std::abs(a) < std::abs(b);
          }));
          for (int64_t i = config.dModel; i < 2 * config.dModel; ++i)
            EXPECT_LE(std::abs(g[i]), 1e-6 * largest) << name << " key element " << i << " is not zero to rounding";
        }
      }
    }
    optimizer->step();
  }
  for (auto& [name, p] : params) {
    const Record& expected = fixture.at("final/" + name);
    if (!name.ends_with("attn.qkv.bias")) {
      EXPECT_LE(relativeError(p, expected), kRelTol) << name << " after " << steps << " steps";
      continue;
    }
    // The key third of the qkv bias adds q.b_k to every score of a query, which softmax
    // ignores: its true gradient is zero, and what both sides compute is rounding noise
    // (|g| ~ 1e-10, checked at step 0), which Adam divides by eps into steps of up to ~1e-4.
    // Those C elements are held to 1e-2; the query and value thirds to kRelTol.
    const int64_t c = config.dModel;
    const std::vector<double> actual = p.toDoubleVector();
    double maxRef = 0.0, qvDiff = 0.0, keyDiff = 0.0;
    for (int64_t i = 0; i < 3 * c; ++i) {
      const double diff = std::abs(actual[i] - expected.values[i]);
      maxRef = std::max(maxRef, std::abs(expected.values[i]));
      (i >= c && i < 2 * c ? keyDiff : qvDiff) = std::max(i >= c && i < 2 * c ? keyDiff : qvDiff, diff);
    }
    EXPECT_LE(qvDiff / maxRef, kRelTol) << name << " (query and value thirds) after " << steps << " steps";
    EXPECT_LE(keyDiff / maxRef, 1e-2) << name << " (key third) after " << steps << " steps";
  }
}

// The batches the fixture was made with are ByteCorpus's file-order batches of the text, so
// the comparison above covers what `kolo train --model lm --no-shuffle` feeds.
TEST(GoldenLm, FixtureBatchesAreTheFileOrderBatches) {
  if (!std::filesystem::exists(kText)) GTEST_SKIP() << kText << " is not installed (Debian's base-files)";
  const auto fixture = lmFixture();
  const data::ByteCorpus corpus(kText, configAt(fixture, 3));
  for (int64_t step = 0; step < configAt(fixture, 5); ++step) {
    const data::Batch batch = corpus.fileOrderBatch(step, configAt(fixture, 4));
    EXPECT_EQ(batch.inputs.toDoubleVector(), batchAt(fixture.at("inputs"), step).toDoubleVector()) << step;
    EXPECT_EQ(batch.labels.toDoubleVector(), batchAt(fixture.at("labels"), step).toDoubleVector()) << step;
  }
}

}  // namespace
}  // namespace kolo
