// `kolo train`'s data: the --data flags mapped onto data::openTrainingData, its lines logged,
// and the sizes the built-in models take from it.
#include "cli/train_loop.h"
#include "kolo/data_files.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

// A sample shape's channels, height and width as the built-in models take them: [F] is a
// table's row (1 x 1 x F), [H, W] a grey image, [C, H, W] an image of C channels.
nn::ModelData modelDataOf(const Shape& sample, int64_t classes, const std::string& path) {
  KOLO_REQUIRE(sample.size() >= 1 && sample.size() <= 3, "--data ", path, ": samples of shape ", shapeString(sample),
               " (the built-in models take [F], [H, W] or [C, H, W])");
  const size_t n = sample.size();
  return {.channels = n == 3 ? sample[0] : 1,
          .height = n >= 2 ? sample[n - 2] : 1,
          .width = sample[n - 1],
          .classes = classes};
}

}  // namespace

data::TrainingData loadDatasets(TrainConfig& config, observe::Logger& logger) {
  const data::DataPathKind kind = data::dataPathKind(config.data.path);
  KOLO_REQUIRE(kind == data::DataPathKind::Table || kind == data::DataPathKind::Shards ||
                   !config.givenFlags.count("--label-column"),
               "--label-column names a column of the .csv or .tsv files in --data");
  data::TrainingDataSpec spec = config.data;
  spec.seed = config.seed;
  const data::TrainingData read = data::openTrainingData(spec);
  if (!read.classNames.empty()) {
    std::string labels;
    for (size_t i = 0; i < read.classNames.size(); ++i)
      labels += (i ? "," : "") + read.classNames[i] + "=" + std::to_string(i);
    logger.info("classes", {{"labels", labels}});
  }
  if (read.heldOut)
    logger.info("held out a test split", {{"train", read.train->size()}, {"test", read.validation->size()}});
  // Stored with checkpoints and --save: the weights expect the inputs so transformed.
  config.standardizer = read.standardizer;
  config.channelNormalization = read.channelNormalization;
  config.modelData = modelDataOf(read.sampleShape, read.classes, config.data.path);
  return read;
}

}  // namespace kolo::cli
