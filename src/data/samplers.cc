// Samplers: the order in which an epoch visits a dataset (sequential, seeded shuffle, and a
// rank's contiguous slice of every global batch for data-parallel training).
#include "kolo/data.h"

namespace kolo::data {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  KOLO_REQUIRE(n >= 0, "sampler size ", n, " is negative");
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> order(n_);
  for (int64_t i = 0; i < n_; ++i) order[i] = i;
  return order;
}

std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  // One generator per (seed, epoch): mixing the epoch through an odd constant keeps nearby
  // seeds and epochs from sharing streams; splitmix64 seeding in Generator does the rest.
  Generator gen(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)));
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased draw in [0, i] by rejection.
    const uint64_t range = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t draw = gen.nextU64();
    while (draw >= limit) draw = gen.nextU64();
    std::swap(order[i], order[static_cast<int64_t>(draw % range)]);
  }
  return order;
}

std::vector<int64_t> Dataset::shuffledOrder(uint64_t seed, int64_t epoch) const {
  return epochPermutation(size(), seed, epoch);
}

ShuffleSampler::ShuffleSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  KOLO_REQUIRE(n >= 0, "sampler size ", n, " is negative");
}

std::vector<int64_t> ShuffleSampler::indices(int64_t epoch) const {
  return epochPermutation(n_, seed_, epoch);
}

DistributedSampler::DistributedSampler(int64_t n, DistributedSamplerOptions options)
    : n_(n), options_(options) {
  KOLO_REQUIRE(n >= 0, "sampler size ", n, " is negative");
  KOLO_REQUIRE(options.worldSize >= 1 && options.rank >= 0 && options.rank < options.worldSize,
               "DistributedSampler: rank ", options.rank, " of world size ", options.worldSize);
  KOLO_REQUIRE(options.globalBatch > 0 && options.globalBatch % options.worldSize == 0,
               "DistributedSampler: global batch ", options.globalBatch,
               " must be a positive multiple of world size ", options.worldSize);
}

DistributedSampler::DistributedSampler(std::shared_ptr<const Dataset> dataset, DistributedSamplerOptions options)
    : DistributedSampler(dataset ? dataset->size() : 0, options) {
  KOLO_REQUIRE(dataset != nullptr, "DistributedSampler: no dataset");
  dataset_ = std::move(dataset);
}

int64_t DistributedSampler::numSamples() const {
  const int64_t fullBatches = n_ / options_.globalBatch;
  const bool partial = n_ % options_.globalBatch != 0;
  const int64_t batches = fullBatches + ((partial && !options_.dropLast) ? 1 : 0);
  return batches * localBatch();
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = dataset_ ? dataset_->shuffledOrder(options_.seed, epoch) : epochPermutation(n_, options_.seed, epoch);
    KOLO_REQUIRE(static_cast<int64_t>(order.size()) == n_, "DistributedSampler: the dataset's shuffled order holds ",
                 order.size(), " indices, not its ", n_, " samples");
  } else {
    order.resize(n_);
    for (int64_t i = 0; i < n_; ++i) order[i] = i;
  }
  const int64_t global = options_.globalBatch;
  const int64_t local = localBatch();
  const int64_t batches = numSamples() / std::max<int64_t>(local, 1);
  std::vector<int64_t> mine;
  mine.reserve(numSamples());
  for (int64_t g = 0; g < batches; ++g) {
    const int64_t begin = g * global + options_.rank * local;
    for (int64_t k = 0; k < local; ++k) {
      // Positions past the end pad by wrapping to the start of the epoch's order.
      const int64_t position = (begin + k) % std::max<int64_t>(n_, 1);
      mine.push_back(order[position]);
    }
  }
  return mine;
}

}  // namespace kolo::data
