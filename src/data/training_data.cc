// openTrainingData: one path of any kind read through the data readers, its test split, the
// training split's standardisation or an image folder's normalisation, each batch flat.
#include "kolo/training_data.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "kolo/data_files.h"
#include "kolo/error.h"
#include "kolo/image_folder.h"
#include "kolo/sharded.h"

namespace kolo::data {
namespace {

// Each batch's inputs as (B, C*H*W), whatever shape the samples have.
class FlatInputs : public Dataset {
 public:
  explicit FlatInputs(std::shared_ptr<const Dataset> base) : base_(std::move(base)) {}
  int64_t size() const override { return base_->size(); }
  Batch gather(const std::vector<int64_t>& indices) const override { return gatherForEpoch(indices, 0); }
  Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const override {
    Batch batch = base_->gatherForEpoch(indices, epoch);
    if (batch.inputs.dim() > 2) batch.inputs = batch.inputs.reshape({batch.inputs.size(0), -1});
    return batch;
  }
  std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const override {
    return base_->shuffledOrder(seed, epoch);
  }

 private:
  std::shared_ptr<const Dataset> base_;
};

bool endsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// "0.286,0.353": the values at float's precision.
std::string numberList(const std::vector<float>& values) {
  std::string text;
  char number[32];
  for (size_t i = 0; i < values.size(); ++i) {
    std::snprintf(number, sizeof number, "%.9g", double(values[i]));
    if (i > 0) text += ',';
    text += number;
  }
  return text;
}

// "N" or "HxW" into options.height and options.width.
void parseImageSize(const std::string& text, ImageFolderOptions& options) {
  const size_t x = text.find('x');
  try {
    options.height = std::stoll(text.substr(0, x));
    options.width = x == std::string::npos ? options.height : std::stoll(text.substr(x + 1));
  } catch (const std::exception&) {
    options.height = 0;
  }
  KOLO_REQUIRE(options.height > 0 && options.width > 0 && options.height <= 8192 && options.width <= 8192,
               "TrainingDataSpec::imageSize ", text, ": expected N or HxW, each in [1, 8192]");
}

// The splits as read, before the held-out split, the limit and standardisation.
struct Read {
  std::shared_ptr<const Dataset> train, test;
};

Read readTable(const TrainingDataSpec& spec, TrainingData& out) {
  const CsvTable table = readCsv(spec.path, {.labelColumn = spec.labelColumn});
  Read read{std::make_shared<TensorDataset>(table.inputs, table.labels), nullptr};
  out.sampleShape = {table.inputs.size(1)};
  out.classes = table.classes;
  out.classNames = table.classNames;
  if (!spec.testPath.empty()) {
    const CsvTable other = readCsv(spec.testPath, {.labelColumn = spec.labelColumn, .classNames = table.classNames});
    KOLO_REQUIRE(other.inputs.size(1) == table.inputs.size(1), "TrainingDataSpec::testPath ", spec.testPath, " has ",
                 other.inputs.size(1), " feature columns, TrainingDataSpec::path ", spec.path, " has ",
                 table.inputs.size(1));
    read.test = std::make_shared<TensorDataset>(other.inputs, other.labels);
    out.classes = std::max(out.classes, other.classes);
  }
  return read;
}

// Training images augmented from the seed, both splits normalised per channel with the
// training folder's statistics; without a test folder, the test split is held out of the same
// images, normalised, without augmentation.
Read readImageFolder(const TrainingDataSpec& spec, TrainingData& out) {
  ImageFolderOptions options;
  options.threads = 2;
  if (!spec.imageSize.empty()) parseImageSize(spec.imageSize, options);
  const auto plain = std::make_shared<ImageFolder>(spec.path, options);
  ChannelStatistics statistics = channelStatistics(*plain);
  out.channelNormalization = "mean=" + numberList(statistics.mean) + ";std=" + numberList(statistics.stddev);
  options.mean = std::move(statistics.mean);
  options.stddev = std::move(statistics.stddev);
  options.classNames = plain->classNames();
  ImageFolderOptions augmented = options;
  augmented.augment = spec.augment;
  augmented.seed = spec.seed;
  out.sampleShape = {plain->channels(), plain->height(), plain->width()};
  out.classNames = plain->classNames();
  out.classes = static_cast<int64_t>(out.classNames.size());
  if (!spec.testPath.empty()) {
    options.height = plain->height();  // the test images are brought to the training size
    options.width = plain->width();
    options.channels = plain->channels();
  }
  return {std::make_shared<ImageFolder>(spec.path, augmented),
          std::make_shared<ImageFolder>(spec.testPath.empty() ? spec.path : spec.testPath, options)};
}

Read readShards(const TrainingDataSpec& spec, TrainingData& out) {
  const std::shared_ptr<ShardedDataset> shards = openShards(spec.path, spec.labelColumn);
  out.sampleShape = shards->gather({0}).inputs.shape();
  out.sampleShape.erase(out.sampleShape.begin());
  KOLO_REQUIRE(!spec.testPath.empty(), "TrainingDataSpec::path ", spec.path,
               " names shards: give the test split with TrainingDataSpec::testPath");
  const std::shared_ptr<ShardedDataset> other = openShards(spec.testPath, spec.labelColumn);
  out.classes = std::max(shards->classes(), other->classes());
  return {shards, other};
}

Read readArrays(const TrainingDataSpec& spec, TrainingData& out) {
  KOLO_REQUIRE(!endsWith(spec.path, ".npy") || !spec.labelsPath.empty(), "TrainingDataSpec::path ", spec.path,
               " holds the inputs only: name the labels' .npy file with TrainingDataSpec::labelsPath");
  const std::shared_ptr<NpyDataset> arrays = loadNpyDataset(spec.path, spec.labelsPath);
  Read read{arrays, nullptr};
  out.sampleShape = arrays->sampleShape();
  out.classes = arrays->classes();
  if (!spec.testPath.empty()) {
    KOLO_REQUIRE(!endsWith(spec.testPath, ".npy") || !spec.testLabelsPath.empty(), "TrainingDataSpec::testPath ",
                 spec.testPath, " holds the inputs only: name the labels' .npy file with TrainingDataSpec::testLabelsPath");
    const std::shared_ptr<NpyDataset> other = loadNpyDataset(spec.testPath, spec.testLabelsPath);
    KOLO_REQUIRE(other->sampleShape() == out.sampleShape, "TrainingDataSpec::testPath ", spec.testPath,
                 " has samples of shape ", shapeString(other->sampleShape()), ", TrainingDataSpec::path ", spec.path,
                 " of ", shapeString(out.sampleShape));
    read.test = other;
    out.classes = std::max(out.classes, other->classes());
  }
  return read;
}

}  // namespace

TrainingData openTrainingData(const TrainingDataSpec& spec) {
  TrainingData out;
  const DataPathKind kind = dataPathKind(spec.path);
  KOLO_REQUIRE(kind == DataPathKind::NumPy || (spec.labelsPath.empty() && spec.testLabelsPath.empty()),
               "TrainingDataSpec::labelsPath and TrainingDataSpec::testLabelsPath go with .npy arrays in "
               "TrainingDataSpec::path and TrainingDataSpec::testPath");
  if (kind == DataPathKind::FashionMnist) {
    KOLO_REQUIRE(spec.testPath.empty(), "TrainingDataSpec::testPath goes with a table or arrays in "
                 "TrainingDataSpec::path; the Fashion-MNIST directory holds its own test split");
    // Only the samples used are read: a short run does not inflate the whole split.
    out.train = std::make_shared<FashionMnist>(spec.path, true, spec.trainLimit);
    out.validation = std::make_shared<FashionMnist>(spec.path, false);
    out.sampleShape = {1, 28, 28};
    out.classes = 10;
    return out;
  }
  const Read read = kind == DataPathKind::Table         ? readTable(spec, out)
                    : kind == DataPathKind::ImageFolder ? readImageFolder(spec, out)
                    : kind == DataPathKind::Shards      ? readShards(spec, out)
                                                        : readArrays(spec, out);
  std::shared_ptr<const Dataset> train = read.train, test = read.test;
  if (spec.testPath.empty()) {
    // A seeded tenth of the data is held out, the same for every rank.
    const Split split = splitDataset(train, 0.1, true, spec.seed);
    test = kind == DataPathKind::ImageFolder ? std::make_shared<Subset>(test, split.test->indices()) : split.test;
    train = split.train;
    out.heldOut = true;
  }
  if (spec.trainLimit > 0 && spec.trainLimit < train->size()) {
    std::vector<int64_t> first(static_cast<size_t>(spec.trainLimit));
    std::iota(first.begin(), first.end(), 0);
    train = std::make_shared<Subset>(train, std::move(first));
  }
  // Image folders are normalised per channel instead; statistics over every shard would make
  // each rank read them all.
  if (spec.standardize && kind != DataPathKind::ImageFolder && kind != DataPathKind::Shards) {
    const Standardizer standardizer = Standardizer::fit(*train);
    out.standardizer = standardizer.toString();
    train = std::make_shared<StandardizedDataset>(train, standardizer);
    test = std::make_shared<StandardizedDataset>(test, standardizer);
  }
  out.train = std::make_shared<FlatInputs>(train);
  out.validation = std::make_shared<FlatInputs>(test);
  return out;
}

}  // namespace kolo::data
