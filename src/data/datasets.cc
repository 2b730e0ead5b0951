// In-memory datasets: TensorDataset (two tensors) and Fashion-MNIST loaded from IDX files; what
// kind of dataset a path names.
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "kolo/data.h"
#include "kolo/data_files.h"

namespace kolo::data {

TensorDataset::TensorDataset(Tensor inputs, Tensor labels) {
  KOLO_REQUIRE(inputs.defined() && labels.defined(), "TensorDataset needs inputs and labels");
  KOLO_REQUIRE(inputs.dim() >= 1 && labels.dim() == 1, "TensorDataset: inputs ",
               shapeString(inputs.shape()), ", labels ", shapeString(labels.shape()),
               " (labels must be [N])");
  KOLO_REQUIRE(inputs.size(0) == labels.size(0), "TensorDataset: ", inputs.size(0), " inputs but ",
               labels.size(0), " labels");
  KOLO_REQUIRE(inputs.dtype() == DType::F32, "TensorDataset inputs must be f32, got ",
               dtypeName(inputs.dtype()));
  KOLO_REQUIRE(labels.dtype() == DType::I64, "TensorDataset labels must be i64, got ",
               dtypeName(labels.dtype()));
  inputs_ = inputs.contiguous();
  labels_ = labels.contiguous();
}

int64_t TensorDataset::size() const { return inputs_.size(0); }

Batch TensorDataset::gather(const std::vector<int64_t>& indices) const {
  Shape shape = inputs_.shape();
  const int64_t rowElements = shapeNumel(shape) / std::max<int64_t>(shape[0], 1);
  shape[0] = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.inputs = Tensor::empty(shape, DType::F32);
  batch.labels = Tensor::empty({shape[0]}, DType::I64);
  batch.indices = indices;
  const float* src = inputs_.data<float>();
  const int64_t* srcLabels = labels_.data<int64_t>();
  float* dst = batch.inputs.data<float>();
  int64_t* dstLabels = batch.labels.data<int64_t>();
  const int64_t n = size();
  for (const int64_t index : indices)
    KOLO_REQUIRE(index >= 0 && index < n, "sample index ", index, " out of range [0, ", n, ")");
  // Rows are scattered over the whole set: start every row's first cache line on its way
  // (and its page walk) at once, instead of one row's memory latency after another.
  for (const int64_t index : indices) __builtin_prefetch(src + index * rowElements);
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t index = indices[i];
    std::memcpy(dst + i * rowElements, src + index * rowElements, sizeof(float) * rowElements);
    dstLabels[i] = srcLabels[index];
  }
  return batch;
}

TensorDataset loadIdxPair(const std::string& imagesPath, const std::string& labelsPath,
                          int64_t maxItems) {
  IdxArray images = readIdx(imagesPath, maxItems);
  IdxArray labels = readIdx(labelsPath, maxItems);
  if (images.dims.size() != 3) {
    KOLO_THROW(FormatError, imagesPath, ": expected 3 dimensions [N, rows, cols], found ",
               shapeString(images.dims));
  }
  if (labels.dims.size() != 1) {
    KOLO_THROW(FormatError, labelsPath, ": expected 1 dimension [N], found ",
               shapeString(labels.dims));
  }
  if (images.fileItems != labels.fileItems) {
    KOLO_THROW(FormatError, "count mismatch: ", imagesPath, " holds ", images.fileItems,
               " images but ", labelsPath, " holds ", labels.fileItems, " labels");
  }
  const int64_t n = images.dims[0];
  const int64_t pixels = images.dims[1] * images.dims[2];
  Tensor inputs = Tensor::empty({n, pixels}, DType::F32);
  float* x = inputs.data<float>();
  const size_t total = images.values.size();
  for (size_t i = 0; i < total; ++i) x[i] = static_cast<float>(images.values[i]) / 255.0f;
  Tensor targets = Tensor::empty({n}, DType::I64);
  int64_t* y = targets.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) y[i] = labels.values[i];
  return TensorDataset(inputs, targets);
}

namespace {

TensorDataset loadFashionMnist(const std::string& dir, bool train, int64_t maxItems) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    KOLO_THROW(FileError, "Fashion-MNIST directory ", dir,
               " does not exist (install the Debian package dataset-fashion-mnist, or pass the "
               "directory holding train-images-idx3-ubyte.gz etc.)");
  }
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images = prefix + "-images-idx3-ubyte.gz";
  const std::string labels = prefix + "-labels-idx1-ubyte.gz";
  for (const std::string& path : {images, labels}) {
    if (::stat(path.c_str(), &info) != 0) {
      KOLO_THROW(FileError, "Fashion-MNIST file ", path,
                 " is missing (install the Debian package dataset-fashion-mnist, or pass the "
                 "directory holding the four *-ubyte.gz files)");
    }
  }
  return loadIdxPair(images, labels, maxItems);
}

}  // namespace

FashionMnist::FashionMnist(const std::string& dir, bool train, int64_t maxItems)
    : TensorDataset(loadFashionMnist(dir, train, maxItems)) {}

DataPathKind dataPathKind(const std::string& path) {
  const auto endsWith = [&](const char* tail) {
    const size_t n = std::strlen(tail);
    return path.size() >= n && path.compare(path.size() - n, n, tail) == 0;
  };
  // A list or a glob: shards (one file alone is read as itself).
  if (path.find_first_of(",*?[") != std::string::npos) return DataPathKind::Shards;
  if (endsWith(".csv") || endsWith(".tsv")) return DataPathKind::Table;
  if (endsWith(".npy") || endsWith(".npz")) return DataPathKind::NumPy;
  if (path == kFashionMnistDir || std::filesystem::exists(path + "/train-images-idx3-ubyte.gz") ||
      !std::filesystem::exists(path))
    return DataPathKind::FashionMnist;
  if (std::filesystem::is_directory(path)) return DataPathKind::ImageFolder;
  KOLO_THROW(InvalidArgument, "dataPathKind: ", path,
             ": expected a .csv or .tsv table, .npy arrays, an .npz archive, a folder of images per class "
             "(DIR/CLASS/*.png|jpg), shards ('DIR/*.npz', or a comma-separated list), or the directory of the "
             "Fashion-MNIST *-ubyte.gz files");
}

}  // namespace kolo::data
