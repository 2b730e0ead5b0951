// A training run's data from one path of any kind kolo reads (the Fashion-MNIST directory, a
// CSV/TSV table, NumPy arrays, an image folder, shards), with its test split (a second path
// of the same kind, or a seeded tenth held out), the training split's standardisation or an
// image folder's per-channel normalisation, and the samples' shape the built-in models are
// sized by. What `kolo train --data` reads, for a user's own program alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/data.h"

namespace kolo::data {

/// What to read: `path` and `testPath` are read by the kind dataPathKind(path) names.
struct TrainingDataSpec {
  std::string path = kFashionMnistDir;
  /// The test split, of the same kind as `path`; "": a seeded tenth of `path` held out
  /// (the Fashion-MNIST directory holds its own test split; shards need one).
  std::string testPath{};
  /// The labels of .npy inputs in `path` and `testPath` (.npy of integers).
  std::string labelsPath{}, testLabelsPath{};
  /// The header's name of a table's label column (tables and .csv shards).
  std::string labelColumn = "label";
  /// Tables and arrays: both splits standardised with the training split's statistics.
  bool standardize = true;
  /// Image folders: a random crop with 4 pixels of padding and a horizontal flip per image
  /// and epoch, drawn from `seed`, on the training split.
  bool augment = true;
  /// Image folders: "" (every image the first one's size), "N" or "HxW" (resized to it).
  std::string imageSize{};
  /// Seeds the held-out split and the augmentations.
  uint64_t seed = 0;
  /// > 0: the first `trainLimit` training samples only (Fashion-MNIST: read no further).
  int64_t trainLimit = 0;
};

/// What openTrainingData read.
struct TrainingData {
  /// The splits, each batch's inputs flat: (B, F).
  std::shared_ptr<const Dataset> train, validation;
  /// One sample's shape before flattening: [F] (a table's row), [H, W] or [C, H, W].
  Shape sampleShape;
  int64_t classes = 0;
  /// The classes' names in class order, where the data names them (string labels of a table,
  /// an image folder's sub-folders); else empty.
  std::vector<std::string> classNames;
  /// Whether the test split was held out of `path` (no `testPath`).
  bool heldOut = false;
  /// The training split's standardisation (Standardizer::toString), "" for none; an image
  /// folder's normalisation ("mean=M0,M1,...;std=S0,S1,...", "" for none). The weights trained
  /// on the data expect them: store them with checkpoints and saved weights.
  std::string standardizer, channelNormalization;
};

/// Opens the data `spec` names. Fashion-MNIST: its training split (trainLimit samples at
/// most) and its t10k test split, samples [1, 28, 28]; shards are never standardised (each
/// rank would read them all) and need `testPath`; an image folder is normalised per channel
/// with its training images' statistics instead of standardised, and its held-out tenth is
/// read without augmentation. Throws the readers' FileError and FormatError (naming the file
/// and record), and InvalidArgument naming TrainingDataSpec's member for options that do not
/// fit the data (labels without .npy inputs, a test split of another width or shape, an
/// imageSize that is not N or HxW in [1, 8192]).
TrainingData openTrainingData(const TrainingDataSpec& spec);

}  // namespace kolo::data
