// kolo::data: datasets, samplers and the prefetching DataLoader that feed training.
// IDX files (the MNIST family, raw or gzip) are read into in-memory tensors; samplers
// decide the order of samples per epoch (sequential, seeded shuffle, or a rank's slice of
// every global batch); the DataLoader gathers batches on a background thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::data {

/// Contents of one IDX file: its dimensions and its unsigned-byte elements (row-major).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;
  /// The first dimension as the file declares it; more than dims[0] when a read stopped at
  /// a limit of items.
  int64_t fileItems = 0;
};

/// Reads an IDX file of unsigned bytes (type code 0x08), raw or gzip-compressed (detected by
/// the gzip magic 1f 8b). Throws IoError when the file cannot be opened and FormatError when
/// the magic is wrong, the element type is not unsigned byte, or the file is truncated or
/// longer than its dimensions say; every message names the file. With `maxItems` > 0, only
/// the first `maxItems` items (slices along the first dimension) are kept and a gzip file is
/// inflated no further than they reach: dims[0] is then at most `maxItems`.
IdxArray readIdx(const std::string& path, int64_t maxItems = 0);

/// readIdx on `size` bytes already in memory (raw or gzip); `source` names them in messages.
/// Throws FormatError as readIdx does; a gzip stream is inflated only as far as the IDX
/// header it holds declares.
IdxArray parseIdx(const uint8_t* data, size_t size, const std::string& source,
                  int64_t maxItems = 0);

/// One batch: inputs (f32, [B, ...]), labels (i64, [B]) and the dataset indices they came from;
/// a language model's windows (ByteWindows) hold token ids instead: inputs and labels both i64
/// (B, T), the labels one token further.
struct Batch {
  Tensor inputs;
  Tensor labels;
  std::vector<int64_t> indices;
};

/// A finite, indexable collection of (input, label) samples.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual int64_t size() const = 0;
  /// Copies the samples at `indices` (each in [0, size())) into a new batch, in that order.
  /// Must be safe to call from a thread other than the one that built the dataset.
  virtual Batch gather(const std::vector<int64_t>& indices) const = 0;
  /// gather for epoch `epoch` (0-based) of training, which the DataLoader calls: a dataset
  /// whose samples change with the epoch (random augmentations drawn from the seed, the
  /// epoch and the index) overrides it; by default gather(indices).
  virtual Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const {
    (void)epoch;
    return gather(indices);
  }
  /// The order in which a shuffled epoch visits the samples; the same on every rank and for
  /// every rank count. By default epochPermutation(size(), seed, epoch); a dataset of many
  /// files (ShardedDataset) orders them so that a global batch reads few files.
  virtual std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const;
};

/// A dataset held in memory as two tensors: inputs f32 [N, ...] and labels i64 [N].
class TensorDataset : public Dataset {
 public:
  /// Takes contiguous copies of both tensors; their first dimensions must agree.
  TensorDataset(Tensor inputs, Tensor labels);
  int64_t size() const override;
  Batch gather(const std::vector<int64_t>& indices) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& labels() const { return labels_; }

 private:
  Tensor inputs_;
  Tensor labels_;
};

/// The default location of the Debian package `dataset-fashion-mnist`.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST (or MNIST, same file names) read from `dir`: the training split
/// (train-*-ubyte.gz, 60000 samples) or the test split (t10k-*, 10000). Images are f32
/// [N, 784] holding pixel / 255, labels i64 [N]. Throws IoError naming the path and the
/// Debian package when the files are missing, FormatError when they are corrupt or the
/// image and label counts disagree. With `maxItems` > 0, only the first `maxItems` samples
/// are read (and the files no further than they reach).
class FashionMnist : public TensorDataset {
 public:
  explicit FashionMnist(const std::string& dir = kFashionMnistDir, bool train = true,
                        int64_t maxItems = 0);
};

/// Loads an images IDX file ([N, rows, cols]) and a labels IDX file ([N]) as above.
TensorDataset loadIdxPair(const std::string& imagesPath, const std::string& labelsPath,
                          int64_t maxItems = 0);

/// Chooses which dataset indices one epoch visits, and in which order.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Number of indices per epoch (what indices(epoch).size() returns).
  virtual int64_t numSamples() const = 0;
  /// The indices of epoch `epoch` (0-based); the same epoch always gives the same list.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t numSamples() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

/// The permutation of 0..n-1 for (seed, epoch): Fisher-Yates driven by a kolo::Generator
/// seeded from both, identical on every platform and every rank.
std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch);

/// A fresh seeded permutation per epoch (epochPermutation(n, seed, epoch)).
class ShuffleSampler : public Sampler {
 public:
  ShuffleSampler(int64_t n, uint64_t seed);
  int64_t numSamples() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

/// Options of DistributedSampler.
struct DistributedSamplerOptions {
  int64_t globalBatch = 128;  // samples per optimizer step over all ranks; divisible by worldSize
  int rank = 0;
  int worldSize = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  /// A last global batch shorter than globalBatch is dropped (true) or padded with samples
  /// from the start of the epoch's order (false), so every rank takes the same count.
  bool dropLast = false;
};

/// A rank's share of every global batch: all ranks draw the same per-epoch order (the seeded
/// permutation, or file order without shuffle); global batch g covers positions
/// g*B ... (g+1)*B-1 of it and rank r takes the contiguous slice r*B/N ... (r+1)*B/N-1.
/// Feed it to a DataLoader with batch size globalBatch / worldSize.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, DistributedSamplerOptions options);
  /// Over `dataset` (size() samples): a shuffled epoch follows dataset->shuffledOrder(seed,
  /// epoch), the same for every rank count, so that a run resumed on another number of ranks
  /// continues the same sample order from the same position.
  DistributedSampler(std::shared_ptr<const Dataset> dataset, DistributedSamplerOptions options);
  int64_t numSamples() const override;
  std::vector<int64_t> indices(int64_t epoch) const override;
  /// Samples of one rank per global batch (globalBatch / worldSize).
  int64_t localBatch() const { return options_.globalBatch / options_.worldSize; }

 private:
  int64_t n_;
  DistributedSamplerOptions options_;
  std::shared_ptr<const Dataset> dataset_;
};

/// Options of DataLoader.
struct DataLoaderOptions {
  int64_t batchSize = 128;
  /// Drop a last batch shorter than batchSize instead of returning it.
  bool dropLast = false;
  /// Batches gathered ahead on a background thread (0: gather on the caller's thread).
  int prefetch = 2;
};

/// Position of a DataLoader: the next batch it returns is batch `batch` of epoch `epoch`.
struct LoaderState {
  int64_t epoch = 0;
  int64_t batch = 0;
};

/// Cuts each epoch of a sampler into batches and gathers them from a dataset, a few batches
/// ahead on a background thread. Deterministic: the batches depend only on the sampler
/// (seed, epoch) and the position, so setState() resumes exactly where state() was taken.
///
/// One range-for is one epoch, from the current position to its end:
///   for (int64_t epoch = loader.state().epoch; epoch < epochs; ++epoch)
///     for (data::Batch& batch : loader) step(batch);
/// (a loader resumed in the middle of an epoch finishes that epoch first).
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
             DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Batches per epoch.
  int64_t batchesPerEpoch() const;
  /// Fills `batch` with the next batch of the current epoch and returns true; at the end of
  /// the epoch returns false once and moves to batch 0 of the next epoch. Rethrows errors
  /// raised while gathering. Blocks while the prefetch thread works.
  bool next(Batch& batch);
  /// Input iterator over the batches left in the current epoch: each increment is a next().
  /// Leaving the loop early (break, exception) leaves the loader after the last batch the
  /// loop saw; running to the end moves it to batch 0 of the next epoch.
  class EpochIterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    EpochIterator() = default;
    Batch& operator*() { return batch_; }
    Batch* operator->() { return &batch_; }
    EpochIterator& operator++() {
      if (!loader_->next(batch_)) loader_ = nullptr;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const EpochIterator& it, std::default_sentinel_t) {
      return it.loader_ == nullptr;
    }

   private:
    friend class DataLoader;
    explicit EpochIterator(DataLoader* loader) : loader_(loader) { ++*this; }
    DataLoader* loader_ = nullptr;
    Batch batch_;
  };
  /// The first batch left in the current epoch (gathers it; blocks as next() does).
  EpochIterator begin() { return EpochIterator(this); }
  std::default_sentinel_t end() { return std::default_sentinel; }

  /// The position of the next batch.
  LoaderState state() const { return state_; }
  /// Moves to `state` (drops batches gathered ahead).
  void setState(const LoaderState& state);

 private:
  struct Prefetcher;
  Batch gatherAt(int64_t epoch, int64_t batchIndex);
  void startPrefetch();
  void stopPrefetch();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  DataLoaderOptions options_;
  LoaderState state_;
  int64_t cachedEpoch_ = -1;
  std::vector<int64_t> cachedIndices_;
  std::unique_ptr<Prefetcher> prefetcher_;
};

}  // namespace kolo::data
