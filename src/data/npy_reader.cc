// NumPy files on disk: .npy and .npz mapped into memory, and the dataset that reads two
// such arrays where they lie.
#include <algorithm>

#include "data/mapped_file.h"
#include "data/npy_format.h"
#include "kolo/data_files.h"
#include "kolo/error.h"

namespace kolo::data {

NpyArray loadNpy(const std::string& path) {
  std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  const uint8_t* data = file->data();
  const size_t size = file->size();
  return parseNpy(std::move(file), data, size, path);
}

std::vector<std::pair<std::string, NpyArray>> loadNpz(const std::string& path) {
  std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  const uint8_t* data = file->data();
  const size_t size = file->size();
  return parseNpz(std::move(file), data, size, path);
}

NpyDataset::NpyDataset(NpyArray inputs, NpyArray labels) : inputs_(std::move(inputs)), labels_(std::move(labels)) {
  if (inputs_.shape().empty())
    KOLO_THROW(FormatError, inputs_.source(), ": the inputs are a scalar; they need a first dimension of samples");
  if (labels_.shape().size() != 1)
    KOLO_THROW(FormatError, labels_.source(), ": the labels have shape ", shapeString(labels_.shape()),
               "; they must be one-dimensional [N]");
  if (inputs_.shape()[0] != labels_.shape()[0])
    KOLO_THROW(FormatError, inputs_.source(), " holds ", inputs_.shape()[0], " samples but ", labels_.source(),
               " holds ", labels_.shape()[0], " labels");
  const int64_t n = inputs_.shape()[0];
  rowElements_ = n > 0 ? inputs_.numel() / n : 0;
  labelValues_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = labels_.integerAt(i);
    if (label < 0) KOLO_THROW(FormatError, labels_.source(), ": label ", i, " is ", label, "; classes start at 0");
    labelValues_[static_cast<size_t>(i)] = label;
    classes_ = std::max(classes_, label + 1);
  }
}

int64_t NpyDataset::size() const { return static_cast<int64_t>(labelValues_.size()); }

Shape NpyDataset::sampleShape() const { return Shape(inputs_.shape().begin() + 1, inputs_.shape().end()); }

Batch NpyDataset::gather(const std::vector<int64_t>& indices) const {
  Shape shape = inputs_.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.inputs = Tensor::empty(shape, DType::F32);
  batch.labels = Tensor::empty({shape[0]}, DType::I64);
  batch.indices = indices;
  float* x = batch.inputs.data<float>();
  int64_t* y = batch.labels.data<int64_t>();
  const int64_t n = size();
  for (const int64_t index : indices)
    KOLO_REQUIRE(index >= 0 && index < n, inputs_.source(), ": sample index ", index, " out of range [0, ", n, ")");
  // Rows are scattered over the file: the loads of a few rows ahead are started while one is
  // converted, instead of one row's memory latency after another.
  constexpr size_t kAhead = 4;
  for (size_t i = 0; i < std::min(kAhead, indices.size()); ++i) inputs_.prefetch(indices[i] * rowElements_, rowElements_);
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t index = indices[i];
    if (i + kAhead < indices.size()) inputs_.prefetch(indices[i + kAhead] * rowElements_, rowElements_);
    inputs_.copyF32(index * rowElements_, rowElements_, x + static_cast<int64_t>(i) * rowElements_);
    y[i] = labelValues_[static_cast<size_t>(index)];
  }
  return batch;
}

std::shared_ptr<NpyDataset> loadNpyDataset(const std::string& inputsPath, const std::string& labelsPath) {
  if (!labelsPath.empty()) return std::make_shared<NpyDataset>(loadNpy(inputsPath), loadNpy(labelsPath));
  auto arrays = loadNpz(inputsPath);
  auto find = [&arrays](const std::string& name) -> const NpyArray* {
    for (const auto& entry : arrays)
      if (entry.first == name) return &entry.second;
    return nullptr;
  };
  static const char* kPairs[][2] = {{"x", "y"}, {"X", "y"}, {"inputs", "labels"}, {"images", "labels"}, {"data", "labels"}};
  for (const auto& pair : kPairs) {
    const NpyArray* x = find(pair[0]);
    const NpyArray* y = find(pair[1]);
    if (x && y) return std::make_shared<NpyDataset>(*x, *y);
  }
  std::string names;
  for (const auto& entry : arrays) names += (names.empty() ? "" : ", ") + entry.first;
  KOLO_THROW(FormatError, inputsPath, ": the archive holds the arrays [", names,
             "]; name the inputs and labels x and y (or inputs/images/data and labels)");
}

}  // namespace kolo::data
