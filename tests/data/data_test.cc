// IDX reading (raw, gzip, and every kind of broken file), Fashion-MNIST loading, samplers
// and the DataLoader's determinism and resumable position.
#include "kolo/data.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "support/error_text.h"
#include "support/fashion_mnist.h"

namespace kolo::data {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("kolo_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<uint8_t> idxBytes(const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& values) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(d >> shift));
  }
  bytes.insert(bytes.end(), values.begin(), values.end());
  return bytes;
}

void writeRaw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void writeGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
}

using kolo::testing::errorOf;

// A tiny labelled image set: n images of 2x3 pixels, pixel value = 10*i + k, label = i % 10.
void writeTinySet(const TempDir& dir, const std::string& prefix, uint32_t n, uint32_t labelCount) {
  std::vector<uint8_t> pixels, labels;
  for (uint32_t i = 0; i < n; ++i) {
    for (int k = 0; k < 6; ++k) pixels.push_back(static_cast<uint8_t>(10 * i + k));
  }
  for (uint32_t i = 0; i < labelCount; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  writeGzip(dir.file(prefix + "-images-idx3-ubyte.gz"), idxBytes({n, 2, 3}, pixels));
  writeGzip(dir.file(prefix + "-labels-idx1-ubyte.gz"), idxBytes({labelCount}, labels));
}

TEST(IdxTest, ReadsRawAndGzipAlike) {
  TempDir dir;
  const std::vector<uint8_t> bytes = idxBytes({2, 3}, {1, 2, 3, 4, 5, 6});
  writeRaw(dir.file("a.idx"), bytes);
  writeGzip(dir.file("a.idx.gz"), bytes);
  for (const std::string name : {"a.idx", "a.idx.gz"}) {
    IdxArray array = readIdx(dir.file(name));
    EXPECT_EQ(array.dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(array.values, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(IdxTest, TruncatedDataNamesFileAndSizes) {
  TempDir dir;
  std::vector<uint8_t> bytes = idxBytes({4, 3}, std::vector<uint8_t>(12, 7));
  bytes.resize(bytes.size() - 5);
  writeGzip(dir.file("short.gz"), bytes);
  const std::string message = errorOf([&] { readIdx(dir.file("short.gz")); });
  EXPECT_NE(message.find("short.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("need 12 bytes, file holds 7"), std::string::npos) << message;
}

TEST(IdxTest, TruncatedGzipStreamIsReported) {
  TempDir dir;
  writeGzip(dir.file("whole.gz"), idxBytes({100}, std::vector<uint8_t>(100, 3)));
  std::ifstream in(dir.file("whole.gz"), std::ios::binary);
  std::vector<uint8_t> compressed((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  compressed.resize(compressed.size() / 2);
  writeRaw(dir.file("cut.gz"), compressed);
  const std::string message = errorOf([&] { readIdx(dir.file("cut.gz")); });
  EXPECT_NE(message.find("cut.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated gzip"), std::string::npos) << message;
}

TEST(IdxTest, BadMagicAndTypeAreReported) {
  TempDir dir;
  writeRaw(dir.file("magic.idx"), {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 0});
  std::string message = errorOf([&] { readIdx(dir.file("magic.idx")); });
  EXPECT_NE(message.find("magic.idx: bad IDX magic"), std::string::npos) << message;
  writeRaw(dir.file("float.idx"), {0, 0, 0x0D, 0x01, 0, 0, 0, 0});
  message = errorOf([&] { readIdx(dir.file("float.idx")); });
  EXPECT_NE(message.find("element type 0xd"), std::string::npos) << message;
  std::vector<uint8_t> extra = idxBytes({2}, {1, 2});
  extra.push_back(9);
  writeRaw(dir.file("long.idx"), extra);
  message = errorOf([&] { readIdx(dir.file("long.idx")); });
  EXPECT_NE(message.find("size mismatch"), std::string::npos) << message;
}

TEST(IdxTest, ALimitKeepsTheFirstItemsAndReadsNoFurther) {
  TempDir dir;
  std::vector<uint8_t> values(4 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i);
  const std::vector<uint8_t> bytes = idxBytes({4, 3}, values);
  writeRaw(dir.file("a.idx"), bytes);
  writeGzip(dir.file("a.idx.gz"), bytes);
  for (const std::string name : {"a.idx", "a.idx.gz"}) {
    IdxArray two = readIdx(dir.file(name), 2);
    EXPECT_EQ(two.dims, (std::vector<int64_t>{2, 3})) << name;
    EXPECT_EQ(two.values, (std::vector<uint8_t>{0, 1, 2, 3, 4, 5})) << name;
    EXPECT_EQ(two.fileItems, 4) << name;
    // A limit at or past the count reads the whole file, checks included.
    for (int64_t limit : {4, 9, 0}) {
      IdxArray all = readIdx(dir.file(name), limit);
      EXPECT_EQ(all.dims, (std::vector<int64_t>{4, 3})) << name << " " << limit;
      EXPECT_EQ(all.values, values) << name << " " << limit;
    }
  }
  // The items a limit keeps must be there; what lies past them is not read.
  std::vector<uint8_t> cut = bytes;
  cut.resize(cut.size() - 4);
  writeRaw(dir.file("cut.idx"), cut);
  writeGzip(dir.file("cut.idx.gz"), cut);
  for (const std::string name : {"cut.idx", "cut.idx.gz"}) {
    EXPECT_EQ(readIdx(dir.file(name), 2).values.size(), 6u) << name;
    const std::string message = errorOf([&] { readIdx(dir.file(name), 3); });
    EXPECT_NE(message.find("truncated IDX data"), std::string::npos) << name << ": " << message;
  }
}

TEST(IdxTest, MissingFileIsIoError) { EXPECT_THROW(readIdx("/nonexistent/kolo/x.idx"), IoError); }

TEST(FashionMnistTest, LoadsScaledImagesAndLabels) {
  TempDir dir;
  writeTinySet(dir, "train", 5, 5);
  FashionMnist set(dir.file(""), true);
  ASSERT_EQ(set.size(), 5);
  EXPECT_EQ(set.inputs().shape(), (Shape{5, 6}));
  Batch batch = set.gather({3, 1});
  EXPECT_FLOAT_EQ(batch.inputs.toFloatVector()[0], 30.0f / 255.0f);
  EXPECT_FLOAT_EQ(batch.inputs.toFloatVector()[6 + 5], 15.0f / 255.0f);
  EXPECT_EQ(batch.labels.dtype(), DType::I64);
  EXPECT_EQ(batch.labels.toDoubleVector(), (std::vector<double>{3, 1}));
}

TEST(FashionMnistTest, CountMismatchNamesBothFiles) {
  TempDir dir;
  writeTinySet(dir, "t10k", 5, 4);
  const std::string message = errorOf([&] { FashionMnist(dir.file(""), false); });
  EXPECT_NE(message.find("holds 5 images"), std::string::npos) << message;
  EXPECT_NE(message.find("t10k-labels-idx1-ubyte.gz holds 4 labels"), std::string::npos) << message;
}

TEST(FashionMnistTest, ALimitLoadsTheFirstSamplesAndStillChecksTheCounts) {
  TempDir dir;
  writeTinySet(dir, "train", 5, 5);
  FashionMnist three(dir.file(""), true, 3);
  ASSERT_EQ(three.size(), 3);
  const FashionMnist all(dir.file(""), true);
  EXPECT_EQ(three.inputs().toFloatVector(), all.inputs().slice(0, 0, 3).toFloatVector());
  EXPECT_EQ(three.labels().toDoubleVector(), (std::vector<double>{0, 1, 2}));
  writeTinySet(dir, "t10k", 5, 4);
  const std::string message = errorOf([&] { FashionMnist(dir.file(""), false, 2); });
  EXPECT_NE(message.find("holds 5 images"), std::string::npos) << message;
}

TEST(FashionMnistTest, MissingDatasetNamesPathAndPackage) {
  std::string message = errorOf([] { FashionMnist("/nonexistent/fmnist", true); });
  EXPECT_NE(message.find("/nonexistent/fmnist"), std::string::npos) << message;
  EXPECT_NE(message.find("dataset-fashion-mnist"), std::string::npos) << message;
  TempDir empty;
  message = errorOf([&] { FashionMnist(empty.file(""), true); });
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz is missing"), std::string::npos) << message;
}

TEST(FashionMnistTest, RealTestSplitIfInstalled) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  FashionMnist test(kFashionMnistDir, false);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(test.inputs().shape(), (Shape{10000, 784}));
  // Known first label of the Fashion-MNIST test split: 9 (ankle boot).
  EXPECT_EQ(test.labels().toDoubleVector()[0], 9.0);
}

TEST(FashionMnistTest, RealTrainingSplitCutAtALimitIsItsPrefix) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const FashionMnist all(kFashionMnistDir, true);
  const FashionMnist first(kFashionMnistDir, true, 1000);
  EXPECT_EQ(all.size(), 60000);
  ASSERT_EQ(first.size(), 1000);
  EXPECT_EQ(first.inputs().toFloatVector(), all.inputs().slice(0, 0, 1000).toFloatVector());
  EXPECT_EQ(first.labels().toDoubleVector(), all.labels().slice(0, 0, 1000).toDoubleVector());
}

TEST(SamplerTest, PermutationIsSeededAndComplete) {
  std::vector<int64_t> a = epochPermutation(1000, 7, 0);
  EXPECT_EQ(a, epochPermutation(1000, 7, 0));
  EXPECT_NE(a, epochPermutation(1000, 7, 1));
  EXPECT_NE(a, epochPermutation(1000, 8, 0));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(SequentialSampler(3).indices(5), (std::vector<int64_t>{0, 1, 2}));
}

TEST(SamplerTest, DistributedSlicesReassembleTheGlobalBatches) {
  const int64_t n = 103, global = 8;
  for (bool dropLast : {false, true}) {
    std::vector<std::vector<int64_t>> perRank;
    for (int rank = 0; rank < 4; ++rank) {
      DistributedSampler sampler(
          n,
          {.globalBatch = global, .rank = rank, .worldSize = 4, .seed = 3, .dropLast = dropLast});
      perRank.push_back(sampler.indices(2));
      EXPECT_EQ(static_cast<int64_t>(perRank.back().size()), sampler.numSamples());
    }
    const std::vector<int64_t> order = epochPermutation(n, 3, 2);
    const int64_t batches = dropLast ? n / global : (n + global - 1) / global;
    ASSERT_EQ(static_cast<int64_t>(perRank[0].size()), batches * 2);
    for (int64_t g = 0; g < batches; ++g) {
      for (int rank = 0; rank < 4; ++rank) {
        for (int k = 0; k < 2; ++k) {
          EXPECT_EQ(perRank[rank][g * 2 + k], order[(g * global + rank * 2 + k) % n]);
        }
      }
    }
  }
  DistributedSampler plain(
      10, {.globalBatch = 4, .rank = 1, .worldSize = 2, .shuffle = false, .dropLast = true});
  EXPECT_EQ(plain.indices(0), (std::vector<int64_t>{2, 3, 6, 7}));
}

std::shared_ptr<TensorDataset> countingDataset(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(-i));
    y.push_back(i);
  }
  return std::make_shared<TensorDataset>(Tensor::fromVector({n, 2}, x), Tensor::fromVector({n}, y));
}

std::vector<std::vector<int64_t>> drain(DataLoader& loader, int epochs) {
  std::vector<std::vector<int64_t>> batches;
  Batch batch;
  for (int e = 0; e < epochs; ++e) {
    while (loader.next(batch)) {
      std::vector<double> labels = batch.labels.toDoubleVector();
      batches.emplace_back(labels.begin(), labels.end());
      EXPECT_EQ(batch.inputs.size(0), batch.labels.size(0));
    }
  }
  return batches;
}

// Arguments a caller got wrong are InvalidArgument naming the values, not a failed internal
// check ("check failed: ... (file:line)", InternalError).
TEST(DataTest, ACallersWrongArgumentsAreUsageErrorsNamingTheValues) {
  const auto usage = [](auto&& fn) {
    const std::string message = errorOf<InvalidArgument>(fn);
    EXPECT_EQ(message.find("check failed"), std::string::npos) << message;
    return message;
  };
  EXPECT_NE(usage([] { TensorDataset(Tensor::zeros({3, 2}), Tensor::zeros({2}, DType::I64)); })
                .find("3 inputs but 2 labels"),
            std::string::npos);
  EXPECT_NE(usage([] { TensorDataset(Tensor::zeros({2, 2}), Tensor::zeros({2})); }).find("labels must be i64"),
            std::string::npos);
  EXPECT_NE(usage([] { countingDataset(4)->gather({4}); }).find("sample index 4 out of range"), std::string::npos);
  EXPECT_NE(usage([] { DataLoader(countingDataset(4), std::make_shared<SequentialSampler>(4), {.batchSize = 0}); })
                .find("batch size must be positive"),
            std::string::npos);
  EXPECT_NE(usage([] { SequentialSampler(-1); }).find("sampler size -1"), std::string::npos);
}

TEST(DataLoaderTest, PrefetchGivesTheSameBatchesAsInline) {
  auto dataset = countingDataset(50);
  auto sampler = std::make_shared<ShuffleSampler>(50, 11);
  DataLoader prefetching(dataset, sampler, {.batchSize = 8, .prefetch = 3});
  DataLoader inlineLoader(dataset, sampler, {.batchSize = 8, .prefetch = 0});
  EXPECT_EQ(prefetching.batchesPerEpoch(), 7);
  const auto a = drain(prefetching, 3);
  EXPECT_EQ(a, drain(inlineLoader, 3));
  ASSERT_EQ(a.size(), 21u);
  EXPECT_EQ(a[6].size(), 2u);  // 50 = 6 * 8 + 2
  std::set<int64_t> firstEpoch;
  for (int b = 0; b < 7; ++b) firstEpoch.insert(a[b].begin(), a[b].end());
  EXPECT_EQ(firstEpoch.size(), 50u);
  EXPECT_NE(a[0], a[7]);  // each epoch reshuffles
}

TEST(DataLoaderTest, DropLastAndSequentialOrder) {
  DataLoader loader(countingDataset(10), std::make_shared<SequentialSampler>(10),
                    {.batchSize = 4, .dropLast = true});
  const auto batches = drain(loader, 1);
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(DataLoaderTest, ResumesExactlyFromState) {
  auto dataset = countingDataset(40);
  auto sampler = std::make_shared<ShuffleSampler>(40, 5);
  DataLoader full(dataset, sampler, {.batchSize = 6});
  const auto reference = drain(full, 2);
  DataLoader first(dataset, sampler, {.batchSize = 6});
  Batch batch;
  for (int i = 0; i < 9; ++i) {
    if (!first.next(batch)) first.next(batch);
  }
  const LoaderState saved = first.state();
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.batch, 2);
  DataLoader resumed(dataset, sampler, {.batchSize = 6});
  resumed.setState(saved);
  std::vector<std::vector<int64_t>> rest;
  while (resumed.next(batch)) {
    std::vector<double> labels = batch.labels.toDoubleVector();
    rest.emplace_back(labels.begin(), labels.end());
  }
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(reference.begin() + 9, reference.end()));
}

TEST(DataLoaderTest, GatherErrorsReachTheCaller) {
  auto dataset = countingDataset(5);
  auto sampler = std::make_shared<SequentialSampler>(9);  // indices past the dataset
  DataLoader loader(dataset, sampler, {.batchSize = 3});
  Batch batch;
  EXPECT_TRUE(loader.next(batch));
  EXPECT_THROW(loader.next(batch), InvalidArgument);
  EXPECT_THROW(loader.next(batch), InvalidArgument);
}

std::vector<int64_t> labelsOf(const Batch& batch) {
  const std::vector<double> labels = batch.labels.toDoubleVector();
  return std::vector<int64_t>(labels.begin(), labels.end());
}

TEST(DataLoaderTest, RangeForIsOneEpochOfNext) {
  auto dataset = countingDataset(30);
  auto sampler = std::make_shared<ShuffleSampler>(30, 9);
  for (int prefetch : {0, 2}) {
    DataLoader reference(dataset, sampler, {.batchSize = 7, .prefetch = prefetch});
    const auto expected = drain(reference, 2);
    DataLoader loader(dataset, sampler, {.batchSize = 7, .prefetch = prefetch});
    std::vector<std::vector<int64_t>> got;
    for (int64_t epoch = loader.state().epoch; epoch < 2; ++epoch) {
      int64_t batches = 0;
      for (Batch& batch : loader) {
        got.push_back(labelsOf(batch));
        ++batches;
      }
      EXPECT_EQ(batches, 5) << "epoch " << epoch;  // 30 = 4 * 7 + 2
      EXPECT_EQ(loader.state().epoch, epoch + 1);
      EXPECT_EQ(loader.state().batch, 0);
    }
    EXPECT_EQ(got, expected) << "prefetch " << prefetch;
  }
}

TEST(DataLoaderTest, RangeForResumesMidEpoch) {
  auto dataset = countingDataset(40);
  auto sampler = std::make_shared<ShuffleSampler>(40, 4);
  DataLoader full(dataset, sampler, {.batchSize = 6});
  const auto reference = drain(full, 2);  // 7 batches per epoch
  // Leave the first epoch after three batches, then finish it with a second loop.
  DataLoader loader(dataset, sampler, {.batchSize = 6});
  std::vector<std::vector<int64_t>> got;
  for (Batch& batch : loader) {
    got.push_back(labelsOf(batch));
    if (got.size() == 3) break;
  }
  EXPECT_EQ(loader.state().batch, 3);
  for (Batch& batch : loader) got.push_back(labelsOf(batch));
  EXPECT_EQ(got, std::vector<std::vector<int64_t>>(reference.begin(), reference.begin() + 7));
  // A loader resumed from a saved state finishes that epoch, then runs whole ones.
  DataLoader resumed(dataset, sampler, {.batchSize = 6});
  resumed.setState({.epoch = 1, .batch = 5});
  std::vector<std::vector<int64_t>> rest;
  for (Batch& batch : resumed) rest.push_back(labelsOf(batch));
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(reference.begin() + 12, reference.end()));
  EXPECT_EQ(resumed.state().epoch, 2);
}

}  // namespace
}  // namespace kolo::data
