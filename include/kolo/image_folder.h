// Image folders as torchvision's ImageFolder lays them out (root/CLASS/*.png|jpg, classes in
// sorted order), decoded with libpng and libjpeg-turbo on the loader's threads, with the
// standard training augmentations (random crop with padding, horizontal flip) drawn from the
// seed, the epoch and the sample, and per-channel normalisation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/data.h"

namespace kolo::data {

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// The classes, in class order: the training folder's (ImageFolder::classNames()), so that a
  /// test folder numbers them alike. Empty: the sub-folders of the root, sorted.
  std::vector<std::string> classNames{};
  /// Every image is resized to height x width (bilinear, as PIL's resize); 0: every image
  /// must have the first image's size.
  int64_t height = 0, width = 0;
  /// 1 (grey) or 3 (RGB): images are converted to it; 0: the first image's.
  int64_t channels = 0;
  /// Training augmentations: a random crop of the image padded by `cropPadding` zero pixels
  /// on each side (0: none), and a horizontal flip with probability 1/2, drawn by a generator
  /// seeded from (seed, epoch, sample index): the same whatever the thread, rank or batch.
  bool augment = false;
  int64_t cropPadding = 4;
  bool horizontalFlip = true;
  uint64_t seed = 0;
  /// Per-channel normalisation of pixel / 255: (x - mean[c]) / stddev[c]; empty: pixel / 255.
  std::vector<float> mean{}, stddev{};
  /// Threads decoding one batch's images (the loader's thread and threads-1 more).
  int threads = 2;
};

/// A dataset of image files: sample i is the i-th file in class order, then file-name order;
/// inputs f32 (B, C, H, W), labels the class indices.
class ImageFolder : public Dataset {
 public:
  /// Lists `root`'s class folders and their .png/.jpg/.jpeg files (case-insensitive) and
  /// decodes the first image for the size and channels. Throws FileError naming the folder
  /// when the root cannot be read, has no class folder, a class of options.classNames has no
  /// folder there, or a class folder holds no image; FormatError for an undecodable first
  /// image; InvalidArgument for bad options.
  ImageFolder(const std::string& root, ImageFolderOptions options = {});
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  /// The images at `indices`, without augmentation. Throws FormatError naming the file when an
  /// image cannot be decoded or (without a resize) has another size than the first.
  Batch gather(const std::vector<int64_t>& indices) const override;
  /// gather with the augmentations of epoch `epoch` (when options.augment).
  Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const override;

  const std::vector<std::string>& classNames() const { return classNames_; }
  const std::string& file(int64_t index) const { return files_.at(static_cast<size_t>(index)); }
  int64_t channels() const { return channels_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }

 private:
  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classNames_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
  int64_t channels_ = 0, height_ = 0, width_ = 0;
};

/// Per-channel mean and standard deviation of pixel / 255, what ImageFolderOptions::mean and
/// ::stddev take (as torchvision users compute for transforms.Normalize).
struct ChannelStatistics {
  std::vector<float> mean, stddev;
};

/// The statistics of `images` over up to `maxImages` of them, evenly spaced in sample order,
/// decoded without augmentation (stddev at least 1e-3). Throws what ImageFolder::gather throws.
ChannelStatistics channelStatistics(const ImageFolder& images, int64_t maxImages = 2048);

/// A decoded image: channels x height x width bytes, channel-interleaved (HWC), as the file
/// holds them.
struct DecodedImage {
  int64_t channels = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;
};

/// Decodes PNG (libpng) or JPEG (libjpeg-turbo) bytes, told apart by their signatures, to
/// `channels` (1 or 3; 0: grey stays grey, anything else becomes RGB). `source` names them in
/// messages. Throws FormatError naming the source for another format, a corrupt or truncated
/// image, or one larger than 2^28 pixels.
DecodedImage decodeImage(const uint8_t* data, size_t size, int64_t channels, const std::string& source);

}  // namespace kolo::data
