// ShardedDataset: shard offsets, shards opened on first use, batches assembled from the
// shards' own gathers, and the block-wise shuffle that depends on the seed and epoch alone.
#include "kolo/sharded.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "kolo/data_files.h"
#include "kolo/error.h"

namespace kolo::data {
namespace {

bool endsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::vector<std::string> expandShardPattern(const std::string& pattern) {
  std::vector<std::string> files;
  size_t begin = 0;
  while (begin <= pattern.size()) {
    size_t end = pattern.find(',', begin);
    if (end == std::string::npos) end = pattern.size();
    const std::string part = pattern.substr(begin, end - begin);
    begin = end + 1;
    if (part.empty()) continue;
    if (part.find_first_of("*?[") == std::string::npos) {
      files.push_back(part);
      continue;
    }
    glob_t found{};
    const int rc = ::glob(part.c_str(), 0, nullptr, &found);
    std::vector<std::string> matches;
    if (rc == 0)
      for (size_t i = 0; i < found.gl_pathc; ++i) matches.emplace_back(found.gl_pathv[i]);
    ::globfree(&found);
    if (matches.empty()) KOLO_THROW(FileError, "no file matches the shard pattern ", part);
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  if (files.empty()) KOLO_THROW(FileError, "the shard pattern '", pattern, "' names no file");
  return files;
}

ShardedDataset::ShardedDataset(std::vector<std::string> files, ShardReader reader, ShardedOptions options)
    : files_(std::move(files)), reader_(std::move(reader)), options_(options) {
  KOLO_REQUIRE(!files_.empty(), "ShardedDataset: no shard files");
  KOLO_REQUIRE(options_.shardsPerBlock >= 1, "ShardedDataset: shardsPerBlock must be at least 1, got ",
               options_.shardsPerBlock);
  KOLO_REQUIRE(reader_.count && reader_.open, "ShardedDataset: the reader needs a count and an open function");
  offsets_.push_back(0);
  for (const std::string& file : files_) {
    const ShardInfo info = reader_.count(file);
    KOLO_REQUIRE(info.samples >= 0, "shard ", file, ": a count of ", info.samples, " samples");
    offsets_.push_back(offsets_.back() + info.samples);
    classes_ = std::max(classes_, info.classes);
  }
  total_ = offsets_.back();
  opened_.resize(files_.size());
}

int64_t ShardedDataset::shardOf(int64_t index) const {
  KOLO_REQUIRE(index >= 0 && index < total_, "sharded dataset: sample index ", index, " out of range [0, ", total_, ")");
  return static_cast<int64_t>(std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin()) - 1;
}

int64_t ShardedDataset::openedShards() const {
  std::lock_guard lock(mutex_);
  return std::count_if(opened_.begin(), opened_.end(), [](const auto& d) { return d != nullptr; });
}

Batch ShardedDataset::gather(const std::vector<int64_t>& indices) const { return gatherForEpoch(indices, 0); }

Batch ShardedDataset::gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const {
  // The rows of each shard, in the batch's order.
  std::vector<std::vector<int64_t>> local(files_.size()), rows(files_.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t shard = shardOf(indices[i]);
    local[size_t(shard)].push_back(indices[i] - offsets_[size_t(shard)]);
    rows[size_t(shard)].push_back(static_cast<int64_t>(i));
  }
  Batch batch;
  batch.indices = indices;
  int64_t rowElements = -1;
  size_t firstShard = 0;
  for (size_t s = 0; s < files_.size(); ++s) {
    if (local[s].empty()) continue;
    std::shared_ptr<const Dataset> shard;
    {
      std::lock_guard lock(mutex_);
      if (!opened_[s]) {
        opened_[s] = reader_.open(files_[s]);
        const int64_t expected = offsets_[s + 1] - offsets_[s];
        if (opened_[s]->size() != expected) {
          const int64_t found = opened_[s]->size();
          opened_[s] = nullptr;
          KOLO_THROW(FormatError, "shard ", files_[s], " holds ", found, " samples, ", expected, " when counted");
        }
      }
      shard = opened_[s];
    }
    const Batch part = shard->gatherForEpoch(local[s], epoch);
    const Tensor inputs = part.inputs.contiguous();
    const int64_t n = static_cast<int64_t>(local[s].size());
    if (rowElements < 0) {
      rowElements = inputs.numel() / n;
      firstShard = s;
      Shape shape = inputs.shape();
      shape[0] = static_cast<int64_t>(indices.size());
      batch.inputs = Tensor::empty(shape, DType::F32);
      batch.labels = Tensor::empty({shape[0]}, DType::I64);
    } else if (inputs.numel() / n != rowElements || inputs.dim() != batch.inputs.dim()) {
      KOLO_THROW(FormatError, "shard ", files_[s], " has samples of shape ", shapeString(inputs.shape()), " per batch, ",
                 files_[firstShard], " of ", shapeString(batch.inputs.shape()));
    }
    const float* from = inputs.data<float>();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t row = rows[s][size_t(k)];
      std::memcpy(batch.inputs.data<float>() + row * rowElements, from + k * rowElements,
                  sizeof(float) * size_t(rowElements));
      batch.labels.data<int64_t>()[row] = part.labels.data<int64_t>()[k];
    }
  }
  if (rowElements < 0) {  // an empty batch: shapes from shard 0's empty gather
    batch.inputs = Tensor::empty({0}, DType::F32);
    batch.labels = Tensor::empty({0}, DType::I64);
  }
  return batch;
}

std::vector<int64_t> ShardedDataset::shuffledOrder(uint64_t seed, int64_t epoch) const {
  const int64_t shards = static_cast<int64_t>(files_.size());
  const std::vector<int64_t> shardOrder = epochPermutation(shards, seed, epoch);
  std::vector<int64_t> order;
  order.reserve(size_t(total_));
  std::vector<int64_t> block;
  for (int64_t b = 0; b * options_.shardsPerBlock < shards; ++b) {
    block.clear();
    for (int64_t k = b * options_.shardsPerBlock; k < std::min(shards, (b + 1) * options_.shardsPerBlock); ++k) {
      const int64_t s = shardOrder[size_t(k)];
      for (int64_t i = offsets_[size_t(s)]; i < offsets_[size_t(s) + 1]; ++i) block.push_back(i);
    }
    const std::vector<int64_t> within = epochPermutation(static_cast<int64_t>(block.size()), seed + uint64_t(b) + 1, epoch);
    for (const int64_t w : within) order.push_back(block[size_t(w)]);
  }
  return order;
}

std::shared_ptr<ShardedDataset> openShards(const std::string& pattern, const std::string& labelColumn,
                                           ShardedOptions options) {
  std::vector<std::string> files = expandShardPattern(pattern);
  const bool npz = endsWith(files.front(), ".npz");
  const bool table = endsWith(files.front(), ".csv") || endsWith(files.front(), ".tsv");
  for (const std::string& file : files)
    if ((npz && !endsWith(file, ".npz")) || (table && !endsWith(file, ".csv") && !endsWith(file, ".tsv")) ||
        (!npz && !table))
      KOLO_THROW(FormatError, "shard ", file, ": shards are all .npz archives or all .csv/.tsv tables (the first is ",
                 files.front(), ")");
  ShardReader reader;
  if (npz) {
    // The count is the first dimension of the labels array's header: the elements stay unread.
    reader.count = [](const std::string& path) {
      const std::shared_ptr<NpyDataset> shard = loadNpyDataset(path);
      return ShardInfo{shard->size(), shard->classes()};
    };
    reader.open = [](const std::string& path) -> std::shared_ptr<const Dataset> { return loadNpyDataset(path); };
  } else {
    // A table's rows are only known by reading it; its string classes are the union of all
    // shards' (sorted), so that every shard numbers them alike.
    auto classes = std::make_shared<std::set<std::string>>();
    reader.count = [labelColumn, classes](const std::string& path) {
      const CsvTable t = readCsv(path, {.labelColumn = labelColumn});
      classes->insert(t.classNames.begin(), t.classNames.end());
      return ShardInfo{t.inputs.size(0), t.classNames.empty() ? t.classes : static_cast<int64_t>(classes->size())};
    };
    reader.open = [labelColumn, classes](const std::string& path) -> std::shared_ptr<const Dataset> {
      CsvTable t = readCsv(path, {.labelColumn = labelColumn,
                                  .classNames = std::vector<std::string>(classes->begin(), classes->end())});
      return std::make_shared<TensorDataset>(t.inputs, t.labels);
    };
  }
  return std::make_shared<ShardedDataset>(std::move(files), std::move(reader), options);
}

}  // namespace kolo::data
