// Sharded datasets: many files of one kind seen as one dataset, each file opened only when a
// sample of it is first gathered, and a shuffled order that is a function of the seed and the
// epoch alone: shards permuted, then the samples of a few shards at a time permuted together,
// so a global batch reads few files and a run resumed on another number of ranks continues
// the same sample order from the same position.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/data.h"

namespace kolo::data {

/// The files a pattern names: a comma-separated list of paths and glob(3) patterns, each
/// pattern's matches sorted. Throws FileError naming a pattern that matches nothing.
std::vector<std::string> expandShardPattern(const std::string& pattern);

/// What ShardedDataset learns of a shard before opening it.
struct ShardInfo {
  int64_t samples = 0;
  /// One more than its largest label (0: unknown).
  int64_t classes = 0;
};

/// How ShardedDataset learns a shard's sample count and opens it.
struct ShardReader {
  /// The file's samples (and classes), read cheaply (a header, the labels); called for every
  /// shard at construction.
  std::function<ShardInfo(const std::string& path)> count;
  /// The file as a dataset of count(path) samples; called at most once per shard, from any
  /// thread, when a sample of it is first gathered.
  std::function<std::shared_ptr<const Dataset>(const std::string& path)> open;
};

/// Options of ShardedDataset.
struct ShardedOptions {
  /// Shards whose samples a shuffled epoch permutes together (>= 1): more mixes better, fewer
  /// keeps the files a global batch reads fewer.
  int64_t shardsPerBlock = 4;
};

/// Shards as one dataset: sample i is sample i - offset(s) of shard s, in file order.
class ShardedDataset : public Dataset {
 public:
  /// Counts every shard's samples with reader.count. Throws InvalidArgument for no files or
  /// bad options, and what reader.count throws (naming the file).
  ShardedDataset(std::vector<std::string> files, ShardReader reader, ShardedOptions options = {});
  int64_t size() const override { return total_; }
  /// Opens the shards the indices fall in (once each), gathers from each and assembles the
  /// batch in `indices`' order. Throws FormatError naming two shards whose samples differ in
  /// shape.
  Batch gather(const std::vector<int64_t>& indices) const override;
  Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  /// The shards in the order of epochPermutation(shards, seed, epoch), cut into blocks of
  /// shardsPerBlock; block b's samples in the order of epochPermutation(block's samples,
  /// seed + b + 1, epoch). Depends on nothing else (not the ranks).
  std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const override;

  const std::vector<std::string>& files() const { return files_; }
  /// The shard that holds sample `index`.
  int64_t shardOf(int64_t index) const;
  /// Shards opened so far by this process.
  int64_t openedShards() const;
  /// The largest of the shards' classes (ShardInfo::classes).
  int64_t classes() const { return classes_; }

 private:
  std::vector<std::string> files_;
  ShardReader reader_;
  ShardedOptions options_;
  std::vector<int64_t> offsets_;  // shard s holds samples [offsets_[s], offsets_[s + 1])
  int64_t total_ = 0;
  int64_t classes_ = 0;
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const Dataset>> opened_;
};

/// A ShardedDataset over .npz archives (arrays x and y, as loadNpyDataset reads them), each
/// counted from its arrays' headers and labels (the inputs stay unread until a sample of the
/// shard is gathered), or .csv/.tsv tables (counted by reading them) with `labelColumn`. Throws FileError for a pattern that matches nothing, FormatError for files of
/// mixed or other kinds.
std::shared_ptr<ShardedDataset> openShards(const std::string& pattern, const std::string& labelColumn = "label",
                                           ShardedOptions options = {});

}  // namespace kolo::data
