// `kolo train`'s data: what --data names (the Fashion-MNIST directory, a CSV/TSV table, NumPy
// arrays, an image folder, shards) read through kolo::data, the test split (--test-data, or a
// seeded tenth held out), the training split's standardisation, and the sizes the built-in
// models take from it.
#include <algorithm>
#include <cstdio>

#include "cli/train_loop.h"
#include "kolo/data_files.h"
#include "kolo/error.h"
#include "kolo/image_folder.h"
#include "kolo/sharded.h"

namespace kolo::cli {
namespace {

// The built-in models take flat samples (the cnn unflattens them): each batch's inputs as
// (B, C*H*W).
class FlatInputs : public data::Dataset {
 public:
  explicit FlatInputs(std::shared_ptr<const data::Dataset> base) : base_(std::move(base)) {}
  int64_t size() const override { return base_->size(); }
  data::Batch gather(const std::vector<int64_t>& indices) const override { return gatherForEpoch(indices, 0); }
  data::Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const override {
    data::Batch batch = base_->gatherForEpoch(indices, epoch);
    if (batch.inputs.dim() > 2) batch.inputs = batch.inputs.reshape({batch.inputs.size(0), -1});
    return batch;
  }
  std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const override {
    return base_->shuffledOrder(seed, epoch);
  }

 private:
  std::shared_ptr<const data::Dataset> base_;
};

bool endsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

using Kind = data::DataPathKind;

// A sample shape's channels, height and width as the built-in models take them: [F] is a
// table's row (1 x 1 x F), [H, W] a grey image, [C, H, W] an image of C channels.
nn::ModelData modelDataOf(const Shape& sample, int64_t classes, const std::string& path) {
  nn::ModelData out;
  out.classes = classes;
  if (sample.size() == 1) {
    out.channels = out.height = 1;
    out.width = sample[0];
  } else if (sample.size() == 2) {
    out.channels = 1;
    out.height = sample[0];
    out.width = sample[1];
  } else if (sample.size() == 3) {
    out.channels = sample[0];
    out.height = sample[1];
    out.width = sample[2];
  } else {
    KOLO_THROW(InvalidArgument, "--data ", path, ": samples of shape ", shapeString(sample),
               " (the built-in models take [F], [H, W] or [C, H, W])");
  }
  return out;
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

std::string classList(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? "," : "") + names[i] + "=" + std::to_string(i);
  return text;
}

}  // namespace

bool readsFashionMnist(const TrainConfig& config) { return data::dataPathKind(config.dataDir) == Kind::FashionMnist; }

RunDatasets loadDatasets(TrainConfig& config, observe::Logger& logger) {
  RunDatasets sets;
  const Kind kind = data::dataPathKind(config.dataDir);
  KOLO_REQUIRE(kind == Kind::NumPy || (config.labelsPath.empty() && config.testLabelsPath.empty()),
               "--labels and --test-labels go with .npy arrays in --data and --test-data");
  KOLO_REQUIRE(kind == Kind::Table || kind == Kind::Shards || !config.givenFlags.count("--label-column"),
               "--label-column names a column of the .csv or .tsv files in --data");
  if (kind == Kind::FashionMnist) {
    KOLO_REQUIRE(config.testData.empty(), "--test-data goes with a table or arrays in --data; the Fashion-MNIST "
                 "directory holds its own test split");
    sets.train = loadTrainingSet(config);
    sets.validation = std::make_shared<data::FashionMnist>(config.dataDir, false);
    return sets;
  }
  std::shared_ptr<const data::Dataset> train, test;
  Shape sample;
  int64_t classes = 0;
  if (kind == Kind::Table) {
    const data::CsvTable table = data::readCsv(config.dataDir, {.labelColumn = config.labelColumn});
    train = std::make_shared<data::TensorDataset>(table.inputs, table.labels);
    sample = {table.inputs.size(1)};
    classes = table.classes;
    if (!table.classNames.empty()) logger.info("classes", {{"labels", classList(table.classNames)}});
    if (!config.testData.empty()) {
      const data::CsvTable other =
          data::readCsv(config.testData, {.labelColumn = config.labelColumn, .classNames = table.classNames});
      KOLO_REQUIRE(other.inputs.size(1) == table.inputs.size(1), "--test-data ", config.testData, " has ",
                   other.inputs.size(1), " feature columns, --data ", config.dataDir, " has ", table.inputs.size(1));
      test = std::make_shared<data::TensorDataset>(other.inputs, other.labels);
      classes = std::max(classes, other.classes);
    }
  } else if (kind == Kind::ImageFolder) {
    // Training images augmented (random crop with 4 pixels of padding, horizontal flips) from
    // --seed, normalised per channel with the training folder's statistics.
    data::ImageFolderOptions options;
    options.threads = 2;
    if (!config.imageSize.empty()) {
      // "N" or "HxW".
      const size_t x = config.imageSize.find('x');
      try {
        options.height = std::stoll(config.imageSize.substr(0, x));
        options.width = x == std::string::npos ? options.height : std::stoll(config.imageSize.substr(x + 1));
      } catch (const std::exception&) {
        options.height = 0;
      }
      KOLO_REQUIRE(options.height > 0 && options.width > 0 && options.height <= 8192 && options.width <= 8192,
                   "--image-size ", config.imageSize, ": expected N or HxW, each in [1, 8192]");
    }
    const auto plain = std::make_shared<data::ImageFolder>(config.dataDir, options);
    data::ChannelStatistics statistics = data::channelStatistics(*plain);
    config.channelNormalization = "mean=" + numberList(statistics.mean) + ";std=" + numberList(statistics.stddev);
    options.mean = std::move(statistics.mean);
    options.stddev = std::move(statistics.stddev);
    options.classNames = plain->classNames();
    data::ImageFolderOptions augmented = options;
    augmented.augment = config.augment;
    augmented.seed = config.seed;
    train = std::make_shared<data::ImageFolder>(config.dataDir, augmented);
    sample = {plain->channels(), plain->height(), plain->width()};
    classes = static_cast<int64_t>(plain->classNames().size());
    config.standardize = false;  // normalised per channel instead
    logger.info("classes", {{"labels", classList(plain->classNames())}});
    if (!config.testData.empty()) {
      options.height = plain->height();  // the test images are brought to the training size
      options.width = plain->width();
      options.channels = plain->channels();
      test = std::make_shared<data::ImageFolder>(config.testData, options);
    } else {
      // The held-out part below is taken from the same images, normalised, without augmentation.
      test = std::make_shared<data::ImageFolder>(config.dataDir, options);
    }
  } else if (kind == Kind::Shards) {
    const std::shared_ptr<data::ShardedDataset> shards = data::openShards(config.dataDir, config.labelColumn);
    train = shards;
    sample = shards->gather({0}).inputs.shape();
    sample.erase(sample.begin());
    KOLO_REQUIRE(!config.testData.empty(), "--data ", config.dataDir, " names shards: give the test split with --test-data");
    const std::shared_ptr<data::ShardedDataset> other = data::openShards(config.testData, config.labelColumn);
    test = other;
    classes = std::max(shards->classes(), other->classes());
    // Statistics over every shard would make each rank read them all: shards are used as they are.
    config.standardize = false;
  } else {
    KOLO_REQUIRE(!endsWith(config.dataDir, ".npy") || !config.labelsPath.empty(), "--data ", config.dataDir,
                 " holds the inputs only: name the labels' .npy file with --labels");
    std::shared_ptr<data::NpyDataset> arrays = data::loadNpyDataset(config.dataDir, config.labelsPath);
    train = arrays;
    sample = arrays->sampleShape();
    classes = arrays->classes();
    if (!config.testData.empty()) {
      KOLO_REQUIRE(!endsWith(config.testData, ".npy") || !config.testLabelsPath.empty(), "--test-data ",
                   config.testData, " holds the inputs only: name the labels' .npy file with --test-labels");
      std::shared_ptr<data::NpyDataset> other = data::loadNpyDataset(config.testData, config.testLabelsPath);
      KOLO_REQUIRE(other->sampleShape() == sample, "--test-data ", config.testData, " has samples of shape ",
                   shapeString(other->sampleShape()), ", --data ", config.dataDir, " of ", shapeString(sample));
      test = other;
      classes = std::max(classes, other->classes());
    }
  }
  if (!test || test == train || (kind == Kind::ImageFolder && config.testData.empty())) {
    // No test file: a seeded tenth of the data is held out, the same for every rank.
    const data::Split split = data::splitDataset(train, 0.1, true, config.seed);
    logger.info("held out a test split", {{"train", split.train->size()}, {"test", split.test->size()}});
    test = kind == Kind::ImageFolder ? std::make_shared<data::Subset>(test, split.test->indices()) : split.test;
    train = split.train;
  }
  if (config.trainLimit > 0 && config.trainLimit < train->size()) {
    std::vector<int64_t> first(static_cast<size_t>(config.trainLimit));
    for (int64_t i = 0; i < config.trainLimit; ++i) first[static_cast<size_t>(i)] = i;
    train = std::make_shared<data::Subset>(train, std::move(first));
  }
  if (config.standardize) {
    // The training split's statistics, for both splits; stored with checkpoints and --save.
    const data::Standardizer standardizer = data::Standardizer::fit(*train);
    config.standardizer = standardizer.toString();
    train = std::make_shared<data::StandardizedDataset>(train, standardizer);
    test = std::make_shared<data::StandardizedDataset>(test, standardizer);
  }
  config.modelData = modelDataOf(sample, classes, config.dataDir);
  sets.train = std::make_shared<FlatInputs>(train);
  sets.validation = std::make_shared<FlatInputs>(test);
  return sets;
}

}  // namespace kolo::cli
