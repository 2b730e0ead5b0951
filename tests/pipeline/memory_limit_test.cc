// Tensor memory accounting and the --memory-limit budget: live bytes follow allocations and
// frees, the peak is kept, an allocation past the budget throws MemoryLimitError naming its
// shape and bytes and leaves the count as it was; the lm built in parts holds the whole
// model's values, and a part holds a fraction of the memory.
#include <gtest/gtest.h>

#include "kolo/byte_size.h"
#include "kolo/memory.h"
#include "kolo/nn/language_model.h"

namespace kolo {
namespace {

class MemoryLimitTest : public ::testing::Test {
 protected:
  void TearDown() override { setTensorMemoryLimit(0); }
};

TEST_F(MemoryLimitTest, CountsAndEnforces) {
  const int64_t base = liveTensorBytes();
  resetPeakTensorBytes();
  {
    Tensor a = Tensor::empty({1024, 256});  // 1 MiB
    EXPECT_EQ(liveTensorBytes() - base, 1 << 20);
    Tensor b = Tensor::empty({256});
    EXPECT_EQ(liveTensorBytes() - base, (1 << 20) + 1024);
  }
  EXPECT_EQ(liveTensorBytes(), base);
  EXPECT_EQ(peakTensorBytes() - base, (1 << 20) + 1024);

  setTensorMemoryLimit(base + (2 << 20));
  Tensor kept = Tensor::empty({1024, 256});
  try {
    Tensor tooMuch = Tensor::empty({2048, 256}, DType::F32);
    ADD_FAILURE() << "an allocation past the budget succeeded";
  } catch (const MemoryLimitError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[2048, 256]"), std::string::npos) << message;
    EXPECT_NE(message.find("2.0 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("setTensorMemoryLimit"), std::string::npos) << message;
  }
  EXPECT_EQ(liveTensorBytes() - base, 1 << 20);  // the refused allocation is not counted
  EXPECT_NO_THROW(Tensor::empty({512, 256}));
}

TEST_F(MemoryLimitTest, ParsesSizes) {
  EXPECT_EQ(parseByteSize("512M"), int64_t{512} << 20);
  EXPECT_EQ(parseByteSize("1.5G"), int64_t{3} << 29);
  EXPECT_EQ(parseByteSize("64K"), 65536);
  EXPECT_EQ(parseByteSize("4096"), 4096);
  EXPECT_THROW(parseByteSize("12Q"), InvalidArgument);
  EXPECT_THROW(parseByteSize("lots"), InvalidArgument);
  EXPECT_THROW(parseByteSize("-1M"), InvalidArgument);
}

TEST_F(MemoryLimitTest, LanguageModelPartsHoldTheWholeModelsLayers) {
  const nn::LanguageModelConfig config{.vocab = 32, .layers = 4, .dModel = 32, .heads = 4, .seqLen = 8};
  Generator gen(3);
  auto whole = nn::makeLanguageModel(config, gen);
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, t] : whole->namedParameters()) values[name] = t.toFloatVector();
  const int64_t wholeBytes = liveTensorBytes();
  whole.reset();
  const int64_t withoutModel = liveTensorBytes();
  size_t seen = 0;
  for (auto [begin, end] : {std::pair{0, 2}, std::pair{2, 4}, std::pair{4, 7}}) {
    Generator again(3);
    resetPeakTensorBytes();
    auto part = nn::makeLanguageModelPart(config, again, begin, end);
    // Built layer by layer: the part never held much more than itself.
    EXPECT_LT(peakTensorBytes() - withoutModel, (wholeBytes - withoutModel) * 3 / 4);
    for (const auto& [name, t] : part->namedParameters()) {
      ASSERT_TRUE(values.count(name)) << name;
      EXPECT_EQ(t.toFloatVector(), values[name]) << name;
      ++seen;
    }
  }
  EXPECT_EQ(seen, values.size());
  Generator g(0);
  EXPECT_THROW(nn::makeLanguageModelPart(config, g, 3, 8), InvalidArgument);
}

}  // namespace
}  // namespace kolo
