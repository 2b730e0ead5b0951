// ImageFolder: the class folders listed once, each batch's images decoded (and resized,
// augmented, normalised) by a few threads, each sample's randomness drawn from its own
// generator so that the result does not depend on which thread decoded it.
#include "kolo/image_folder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "data/mapped_file.h"
#include "kolo/error.h"

namespace kolo::data {
namespace {

namespace fs = std::filesystem;

bool isImageName(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* ext : {".png", ".jpg", ".jpeg"}) {
    const std::string e = ext;
    if (lower.size() > e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

DecodedImage decodeFile(const std::string& path, int64_t channels) {
  const std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  return decodeImage(file->data(), file->size(), channels, path);
}

// Bilinear resize of an HWC image with half-pixel centres (PIL's and OpenCV's convention).
DecodedImage resized(const DecodedImage& in, int64_t height, int64_t width) {
  if (in.height == height && in.width == width) return in;
  DecodedImage out{in.channels, height, width, std::vector<uint8_t>(size_t(in.channels * height * width))};
  const double sy = double(in.height) / double(height), sx = double(in.width) / double(width);
  for (int64_t y = 0; y < height; ++y) {
    const double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, double(in.height - 1));
    const int64_t y0 = int64_t(fy), y1 = std::min(y0 + 1, in.height - 1);
    const double wy = fy - double(y0);
    for (int64_t x = 0; x < width; ++x) {
      const double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, double(in.width - 1));
      const int64_t x0 = int64_t(fx), x1 = std::min(x0 + 1, in.width - 1);
      const double wx = fx - double(x0);
      for (int64_t c = 0; c < in.channels; ++c) {
        auto at = [&](int64_t yy, int64_t xx) { return double(in.pixels[size_t((yy * in.width + xx) * in.channels + c)]); };
        const double v = (at(y0, x0) * (1 - wx) + at(y0, x1) * wx) * (1 - wy) + (at(y1, x0) * (1 - wx) + at(y1, x1) * wx) * wy;
        out.pixels[size_t((y * width + x) * in.channels + c)] = uint8_t(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
  return out;
}

}  // namespace

ImageFolder::ImageFolder(const std::string& root, ImageFolderOptions options) : root_(root), options_(std::move(options)) {
  KOLO_REQUIRE(options_.channels == 0 || options_.channels == 1 || options_.channels == 3, "ImageFolder ", root,
               ": channels must be 0, 1 or 3, got ", options_.channels);
  KOLO_REQUIRE((options_.height == 0) == (options_.width == 0) && options_.height >= 0 && options_.width >= 0,
               "ImageFolder ", root, ": give both a height and a width to resize to, or neither");
  KOLO_REQUIRE(options_.cropPadding >= 0 && options_.threads >= 1, "ImageFolder ", root,
               ": crop padding and threads must be non-negative and positive");
  KOLO_REQUIRE(options_.mean.size() == options_.stddev.size(), "ImageFolder ", root, ": ", options_.mean.size(),
               " means but ", options_.stddev.size(), " standard deviations");
  std::error_code error;
  if (!fs::is_directory(root, error)) KOLO_THROW(FileError, "image folder ", root, " is not a directory");
  classNames_ = options_.classNames;
  if (classNames_.empty()) {
    for (const fs::directory_entry& entry : fs::directory_iterator(root, error))
      if (entry.is_directory()) classNames_.push_back(entry.path().filename().string());
    if (error) KOLO_THROW(FileError, "cannot list image folder ", root, ": ", error.message());
    std::sort(classNames_.begin(), classNames_.end());
    if (classNames_.empty())
      KOLO_THROW(FileError, "image folder ", root, " holds no class folder (expected ", root, "/CLASS/*.png or *.jpg)");
  }
  for (size_t c = 0; c < classNames_.size(); ++c) {
    const fs::path folder = fs::path(root) / classNames_[c];
    if (!fs::is_directory(folder, error))
      KOLO_THROW(FileError, "image folder ", root, " has no folder for class '", classNames_[c], "' (", folder.string(),
                 " is missing)");
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(folder, error))
      if (entry.is_regular_file() && isImageName(entry.path().filename().string()))
        names.push_back(entry.path().filename().string());
    if (names.empty()) KOLO_THROW(FileError, "class folder ", folder.string(), " holds no .png or .jpg image");
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      files_.push_back((folder / name).string());
      labels_.push_back(static_cast<int64_t>(c));
    }
  }
  const DecodedImage first = decodeFile(files_.front(), options_.channels);
  channels_ = first.channels;
  height_ = options_.height > 0 ? options_.height : first.height;
  width_ = options_.width > 0 ? options_.width : first.width;
  KOLO_REQUIRE(options_.mean.empty() || static_cast<int64_t>(options_.mean.size()) == channels_, "ImageFolder ", root,
               ": ", options_.mean.size(), " means for images of ", channels_, " channel(s)");
}

Batch ImageFolder::gather(const std::vector<int64_t>& indices) const { return gatherForEpoch(indices, -1); }

Batch ImageFolder::gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const {
  const int64_t n = size();
  for (const int64_t index : indices)
    KOLO_REQUIRE(index >= 0 && index < n, "image folder ", root_, ": sample index ", index, " out of range [0, ", n, ")");
  const int64_t rows = static_cast<int64_t>(indices.size());
  const int64_t plane = height_ * width_;
  Batch batch;
  batch.inputs = Tensor::empty({rows, channels_, height_, width_}, DType::F32);
  batch.labels = Tensor::empty({rows}, DType::I64);
  batch.indices = indices;
  float* out = batch.inputs.data<float>();
  // Each channel's 256 values as torchvision's ToTensor and Normalize give them:
  // (pixel / 255 - mean) / stddev.
  std::vector<float> table(size_t(channels_) * 256);
  for (int64_t c = 0; c < channels_; ++c)
    for (int p = 0; p < 256; ++p) {
      float v = float(p) / 255.0f;
      if (!options_.mean.empty()) v = (v - options_.mean[size_t(c)]) / options_.stddev[size_t(c)];
      table[size_t(c * 256 + p)] = v;
    }
  const bool augment = options_.augment && epoch >= 0;
  auto decodeRow = [&](int64_t row) {
    const int64_t index = indices[size_t(row)];
    batch.labels.data<int64_t>()[row] = labels_[size_t(index)];
    DecodedImage image = decodeFile(files_[size_t(index)], channels_);
    if (options_.height > 0) {
      image = resized(image, height_, width_);
    } else if (image.height != height_ || image.width != width_) {
      KOLO_THROW(FormatError, files_[size_t(index)], ": an image of ", image.width, "x", image.height, ", the folder's first (",
                 files_.front(), ") is ", width_, "x", height_, "; give a size to resize to");
    }
    // The crop's offset into the padded image and the flip, from (seed, epoch, index) alone.
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (augment) {
      Generator gen(options_.seed ^ (0x9E3779B97F4A7C15ull * uint64_t(epoch + 1)) ^
                    (0xC2B2AE3D27D4EB4Full * uint64_t(index + 1)));
      const uint64_t span = uint64_t(2 * options_.cropPadding + 1);
      dy = int64_t(gen.nextU64() % span) - options_.cropPadding;
      dx = int64_t(gen.nextU64() % span) - options_.cropPadding;
      flip = options_.horizontalFlip && (gen.nextU64() & 1) != 0;
    }
    float* dst = out + row * channels_ * plane;
    for (int64_t c = 0; c < channels_; ++c) {
      const float* value = table.data() + c * 256;
      const float zero = value[0];  // the padding: pixel 0, normalised
      for (int64_t y = 0; y < height_; ++y) {
        const int64_t sy = y + dy;
        for (int64_t x = 0; x < width_; ++x) {
          const int64_t sx = (flip ? width_ - 1 - x : x) + dx;
          float v = zero;
          if (sy >= 0 && sy < height_ && sx >= 0 && sx < width_)
            v = value[image.pixels[size_t((sy * width_ + sx) * channels_ + c)]];
          dst[c * plane + y * width_ + x] = v;
        }
      }
    }
  };
  // Rows split over the threads in turn; the first error is rethrown once all have stopped.
  const int threads = int(std::min<int64_t>(options_.threads, rows));
  std::vector<std::exception_ptr> errors(size_t(std::max(threads, 1)));
  auto work = [&](int t) {
    try {
      for (int64_t row = t; row < rows; row += threads) decodeRow(row);
    } catch (...) {
      errors[size_t(t)] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  if (threads > 0) work(0);
  for (std::thread& helper : helpers) helper.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return batch;
}

ChannelStatistics channelStatistics(const ImageFolder& images, int64_t maxImages) {
  KOLO_REQUIRE(maxImages > 0, "channelStatistics: maxImages ", maxImages, " must be positive");
  const int64_t n = images.size(), take = std::min(n, maxImages);
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < take; ++i) picked.push_back(i * n / take);
  const int64_t c = images.channels(), plane = images.height() * images.width();
  std::vector<double> sum(size_t(c), 0.0), squares(size_t(c), 0.0);
  for (size_t begin = 0; begin < picked.size(); begin += 256) {  // 256 images decoded at a time
    const std::vector<int64_t> part(picked.begin() + std::ptrdiff_t(begin),
                                    picked.begin() + std::ptrdiff_t(std::min(picked.size(), begin + 256)));
    const Batch batch = images.gather(part);
    const float* x = batch.inputs.data<float>();
    for (size_t r = 0; r < part.size(); ++r)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t p = 0; p < plane; ++p) {
          const double v = x[(int64_t(r) * c + k) * plane + p];
          sum[size_t(k)] += v;
          squares[size_t(k)] += v * v;
        }
  }
  ChannelStatistics out;
  const double count = double(take * plane);
  for (int64_t k = 0; k < c; ++k) {
    const double m = sum[size_t(k)] / count;
    out.mean.push_back(float(m));
    out.stddev.push_back(float(std::max(1e-3, std::sqrt(std::max(0.0, squares[size_t(k)] / count - m * m)))));
  }
  return out;
}

}  // namespace kolo::data
