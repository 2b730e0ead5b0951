// ByteCorpus: the split into training and held-out parts, random windows that depend on the
// seed and step only, and file-order windows (row i of step s at byte (s*B + i)*T, wrapping
// to byte 0 after the last full batch); ByteWindows, the windows as a dataset whose samples
// in file order give fileOrderBatch's batches.
#include "kolo/byte_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/error_text.h"

namespace kolo::data {
namespace {

// Bytes whose value names their position (mod 251), so a window shows where it starts.
std::vector<uint8_t> countingBytes(int64_t n) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 251);
  return bytes;
}

// The starting byte of each row of `inputs` (B, T), read back from countingBytes' values
// (unambiguous while starts stay below 251).
std::vector<int64_t> rowStarts(const Tensor& inputs) {
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < inputs.shape()[0]; ++i) starts.push_back(inputs.data<int64_t>()[i * inputs.shape()[1]]);
  return starts;
}

TEST(ByteCorpus, TrainingPartIsTheFirstNinetyPercent) {
  const ByteCorpus corpus(countingBytes(1000), 8, 0.1, "counting");
  EXPECT_EQ(corpus.trainBytes(), 900);
  EXPECT_EQ(corpus.heldOutBytes(), 100);
  EXPECT_EQ(corpus.windows(), (900 - 1) / 8);
  EXPECT_EQ(corpus.windows(true), (100 - 1) / 8);
}

TEST(ByteCorpus, FileOrderRowIOfStepSStartsAtByteSBPlusITimesT) {
  const int64_t t = 4, b = 3;
  const ByteCorpus corpus(countingBytes(240), t, 0.1, "counting");  // 216 training bytes, 53 windows
  for (int64_t s = 0; s < 5; ++s) {
    const Batch batch = corpus.fileOrderBatch(s, b);
    ASSERT_EQ(batch.inputs.shape(), (Shape{b, t}));
    ASSERT_EQ(batch.labels.shape(), (Shape{b, t}));
    for (int64_t i = 0; i < b; ++i) {
      const int64_t start = (s * b + i) * t;
      for (int64_t j = 0; j < t; ++j) {
        EXPECT_EQ(batch.inputs.data<int64_t>()[i * t + j], start + j) << "step " << s << " row " << i;
        EXPECT_EQ(batch.labels.data<int64_t>()[i * t + j], start + j + 1) << "step " << s << " row " << i;
      }
    }
  }
}

TEST(ByteWindows, SamplesInFileOrderAreFileOrderBatchesAndIndicesAreChecked) {
  const int64_t t = 4, b = 3;
  auto corpus = std::make_shared<const ByteCorpus>(countingBytes(240), t, 0.1, "counting");
  const ByteWindows windows(corpus);
  EXPECT_EQ(windows.size(), corpus->windows());
  for (int64_t s = 0; s < 4; ++s) {
    const Batch expected = corpus->fileOrderBatch(s, b);
    const Batch got = windows.gather({s * b, s * b + 1, s * b + 2});
    EXPECT_EQ(rowStarts(got.inputs), rowStarts(expected.inputs)) << "step " << s;
    EXPECT_EQ(got.labels.toFloatVector(), expected.labels.toFloatVector()) << "step " << s;
  }
  const ByteWindows heldOut(corpus, true);
  EXPECT_EQ(heldOut.size(), corpus->windows(true));
  EXPECT_EQ(rowStarts(heldOut.gather({0}).inputs), rowStarts(corpus->fileOrderBatch(0, 1, true).inputs));
  EXPECT_THROW(windows.gather({windows.size()}), InvalidArgument);
  EXPECT_THROW(windows.gather({-1}), InvalidArgument);
}

TEST(ByteCorpus, FileOrderWrapsToByteZeroAfterTheLastFullBatch) {
  const int64_t t = 4, b = 3;
  const ByteCorpus corpus(countingBytes(240), t, 0.1, "counting");
  const int64_t windows = corpus.windows();  // 53: 17 full batches, 2 windows skipped
  ASSERT_EQ(windows, 53);
  const int64_t epoch = windows / b;
  // The last step of the epoch reads windows 48..50, the last bytes any window of it reads
  // are inside the training part; the next step starts at byte 0 again.
  EXPECT_EQ(rowStarts(corpus.fileOrderBatch(epoch - 1, b).inputs), (std::vector<int64_t>{192, 196, 200}));
  EXPECT_LE((windows - 1) * t + t, corpus.trainBytes() - 1);  // the last window's last label
  for (int64_t s = 0; s < 3; ++s) {
    const Batch first = corpus.fileOrderBatch(s, b), again = corpus.fileOrderBatch(s + epoch, b);
    EXPECT_EQ(again.inputs.toDoubleVector(), first.inputs.toDoubleVector()) << "step " << s + epoch;
    EXPECT_EQ(again.labels.toDoubleVector(), first.labels.toDoubleVector()) << "step " << s + epoch;
  }
}

TEST(ByteCorpus, FileOrderOfTheHeldOutPartStartsWhereTrainingEnds) {
  const ByteCorpus corpus(countingBytes(240), 4, 0.25, "counting");  // held out: bytes 180..239
  EXPECT_EQ(rowStarts(corpus.fileOrderBatch(1, 2, true).inputs), (std::vector<int64_t>{180 + 8, 180 + 12}));
}

TEST(ByteCorpus, FileOrderNeedsABatchOfWindows) {
  const ByteCorpus corpus(countingBytes(100), 8, 0.1, "tiny.txt");  // 90 bytes: 11 windows
  EXPECT_NO_THROW(corpus.fileOrderBatch(0, 11));
  const std::string tooFew = testing::errorOf<InvalidArgument>([&] { corpus.fileOrderBatch(0, 12); });
  EXPECT_THAT(tooFew, ::testing::HasSubstr("tiny.txt"));
  EXPECT_THAT(tooFew, ::testing::HasSubstr("11 windows"));
  EXPECT_THAT(tooFew, ::testing::HasSubstr("batch of 12"));
  EXPECT_THAT(testing::errorOf<InvalidArgument>([&] { corpus.fileOrderBatch(-1, 2); }),
              ::testing::HasSubstr("negative"));
}

TEST(ByteCorpus, RandomWindowsDependOnSeedAndStepOnly) {
  const ByteCorpus corpus(countingBytes(240), 4, 0.1, "counting");
  const Batch a = corpus.batch(3, 5, 7), b = corpus.batch(3, 5, 7), c = corpus.batch(4, 5, 7);
  EXPECT_EQ(a.inputs.toDoubleVector(), b.inputs.toDoubleVector());
  EXPECT_NE(a.inputs.toDoubleVector(), c.inputs.toDoubleVector());
  for (int64_t start : rowStarts(a.inputs)) EXPECT_LE(start + 4, corpus.trainBytes() - 1);
}

}  // namespace
}  // namespace kolo::data
