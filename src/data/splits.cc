// Standardisation with the training split's statistics, subsets by index, and train/test
// splits by fraction.
#include <charconv>
#include <cmath>
#include <sstream>

#include "kolo/data_files.h"
#include "kolo/error.h"

namespace kolo::data {

Standardizer Standardizer::fit(const Dataset& dataset) {
  const int64_t n = dataset.size();
  KOLO_REQUIRE(n > 0, "Standardizer::fit: the dataset is empty");
  std::vector<double> sum, squares;
  constexpr int64_t kChunk = 4096;
  std::vector<int64_t> indices;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    indices.clear();
    for (int64_t i = begin; i < std::min(n, begin + kChunk); ++i) indices.push_back(i);
    const Batch batch = dataset.gather(indices);
    const int64_t rows = static_cast<int64_t>(indices.size());
    const int64_t width = batch.inputs.numel() / rows;
    if (sum.empty()) {
      sum.assign(static_cast<size_t>(width), 0.0);
      squares.assign(static_cast<size_t>(width), 0.0);
    }
    const float* x = batch.inputs.contiguous().data<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t f = 0; f < width; ++f) {
        const double v = x[r * width + f];
        sum[static_cast<size_t>(f)] += v;
        squares[static_cast<size_t>(f)] += v * v;
      }
  }
  Standardizer out;
  for (size_t f = 0; f < sum.size(); ++f) {
    const double mean = sum[f] / double(n);
    const double variance = std::max(0.0, squares[f] / double(n) - mean * mean);
    const double stddev = std::sqrt(variance);
    out.mean.push_back(mean);
    out.stddev.push_back(stddev > 1e-12 * std::max(1.0, std::fabs(mean)) ? stddev : 1.0);
  }
  return out;
}

void Standardizer::apply(Tensor& inputs) const {
  const int64_t width = static_cast<int64_t>(mean.size());
  const int64_t rows = inputs.dim() > 0 ? inputs.size(0) : 0;
  KOLO_REQUIRE(inputs.dtype() == DType::F32 && inputs.isContiguous(), "Standardizer::apply: inputs must be contiguous f32");
  KOLO_REQUIRE(rows == 0 || inputs.numel() == rows * width, "Standardizer::apply: a sample has ",
               rows ? inputs.numel() / rows : 0, " elements, the statistics are of ", width);
  std::vector<float> shift(mean.begin(), mean.end()), scale(stddev.size());
  for (size_t f = 0; f < scale.size(); ++f) scale[f] = static_cast<float>(1.0 / stddev[f]);
  float* x = inputs.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < width; ++f) x[r * width + f] = (x[r * width + f] - shift[size_t(f)]) * scale[size_t(f)];
}

std::string Standardizer::toString() const {
  std::string out;
  char buffer[32];
  for (int part = 0; part < 2; ++part) {
    const std::vector<double>& values = part == 0 ? mean : stddev;
    if (part == 1) out += ';';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i) out += ',';
      const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, values[i]);
      out.append(buffer, end);
    }
  }
  return out;
}

Standardizer Standardizer::parse(const std::string& text, const std::string& source) {
  Standardizer out;
  const size_t split = text.find(';');
  if (split == std::string::npos) KOLO_THROW(FormatError, source, ": standardisation statistics without ';'");
  for (int part = 0; part < 2; ++part) {
    std::vector<double>& values = part == 0 ? out.mean : out.stddev;
    const char* p = text.data() + (part == 0 ? 0 : split + 1);
    const char* end = text.data() + (part == 0 ? split : text.size());
    while (p < end) {
      double v = 0.0;
      const auto [next, ec] = std::from_chars(p, end, v);
      if (ec != std::errc() || (next < end && *next != ','))
        KOLO_THROW(FormatError, source, ": malformed standardisation statistics");
      values.push_back(v);
      p = next < end ? next + 1 : next;
    }
  }
  if (out.mean.size() != out.stddev.size())
    KOLO_THROW(FormatError, source, ": ", out.mean.size(), " means but ", out.stddev.size(), " standard deviations");
  for (double s : out.stddev)
    if (!(s > 0.0)) KOLO_THROW(FormatError, source, ": a standard deviation of ", s);
  return out;
}

StandardizedDataset::StandardizedDataset(std::shared_ptr<const Dataset> base, Standardizer standardizer)
    : base_(std::move(base)), standardizer_(std::move(standardizer)) {
  KOLO_REQUIRE(base_ != nullptr, "StandardizedDataset: no dataset");
}

Batch StandardizedDataset::gather(const std::vector<int64_t>& indices) const { return gatherForEpoch(indices, 0); }

Batch StandardizedDataset::gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const {
  Batch batch = base_->gatherForEpoch(indices, epoch);
  batch.inputs = batch.inputs.contiguous();
  standardizer_.apply(batch.inputs);
  return batch;
}

std::vector<int64_t> StandardizedDataset::shuffledOrder(uint64_t seed, int64_t epoch) const {
  return base_->shuffledOrder(seed, epoch);
}

Subset::Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  KOLO_REQUIRE(base_ != nullptr, "Subset: no dataset");
  const int64_t n = base_->size();
  for (const int64_t index : indices_)
    KOLO_REQUIRE(index >= 0 && index < n, "Subset: index ", index, " is outside the dataset's ", n, " samples");
}

Batch Subset::gather(const std::vector<int64_t>& indices) const { return gatherForEpoch(indices, 0); }

Batch Subset::gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const {
  std::vector<int64_t> inBase;
  inBase.reserve(indices.size());
  for (const int64_t i : indices) {
    KOLO_REQUIRE(i >= 0 && i < size(), "Subset: sample index ", i, " out of range [0, ", size(), ")");
    inBase.push_back(indices_[static_cast<size_t>(i)]);
  }
  Batch batch = base_->gatherForEpoch(inBase, epoch);
  batch.indices = indices;
  return batch;
}

Split splitDataset(std::shared_ptr<const Dataset> dataset, double testFraction, bool shuffle, uint64_t seed) {
  KOLO_REQUIRE(dataset != nullptr, "splitDataset: no dataset");
  KOLO_REQUIRE(testFraction > 0.0 && testFraction < 1.0, "splitDataset: the test fraction must be in (0, 1), got ",
               testFraction);
  const int64_t n = dataset->size();
  KOLO_REQUIRE(n >= 2, "splitDataset: a dataset of ", n, " sample(s) cannot be split");
  const int64_t test = std::clamp<int64_t>(static_cast<int64_t>(double(n) * testFraction), 1, n - 1);
  std::vector<int64_t> order;
  if (shuffle) {
    order = epochPermutation(n, seed, 0);
  } else {
    order.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  }
  std::vector<int64_t> trainPart(order.begin(), order.end() - test), testPart(order.end() - test, order.end());
  return {std::make_shared<Subset>(dataset, std::move(trainPart)), std::make_shared<Subset>(dataset, std::move(testPart))};
}

}  // namespace kolo::data
