// DataLoader: batches cut from a sampler's epoch order, gathered ahead on a prefetch thread.
// The producer walks (epoch, batch) positions in order and the consumer checks that what
// it pops is the position it expects, so results never depend on thread timing.
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "kolo/data.h"
#include "kolo/trace.h"

namespace kolo::data {

struct DataLoader::Prefetcher {
  struct Item {
    LoaderState position;
    Batch batch;
    std::exception_ptr error;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Item> ready;
  bool stop = false;
  std::thread worker;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       std::shared_ptr<const Sampler> sampler, DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  KOLO_REQUIRE(dataset_ && sampler_, "DataLoader needs a dataset and a sampler");
  KOLO_REQUIRE(options_.batchSize > 0, "DataLoader batch size must be positive, got ",
               options_.batchSize);
  KOLO_REQUIRE(options_.prefetch >= 0, "DataLoader prefetch depth must be at least 0, got ",
               options_.prefetch);
  KOLO_REQUIRE(batchesPerEpoch() > 0, "DataLoader: ", sampler_->numSamples(),
               " samples per epoch make no batch of ", options_.batchSize,
               options_.dropLast ? " with dropLast" : "");
  startPrefetch();
}

DataLoader::~DataLoader() { stopPrefetch(); }

int64_t DataLoader::batchesPerEpoch() const {
  const int64_t n = sampler_->numSamples();
  return options_.dropLast ? n / options_.batchSize
                           : (n + options_.batchSize - 1) / options_.batchSize;
}

Batch DataLoader::gatherAt(int64_t epoch, int64_t batchIndex) {
  if (cachedEpoch_ != epoch) {
    cachedIndices_ = sampler_->indices(epoch);
    cachedEpoch_ = epoch;
  }
  const int64_t begin = batchIndex * options_.batchSize;
  const int64_t end =
      std::min<int64_t>(begin + options_.batchSize, static_cast<int64_t>(cachedIndices_.size()));
  std::vector<int64_t> indices(cachedIndices_.begin() + begin, cachedIndices_.begin() + end);
  Batch batch = dataset_->gatherForEpoch(indices, epoch);
  // A dataset of one's own may leave them out; the loader knows them.
  if (batch.indices.empty()) batch.indices = std::move(indices);
  return batch;
}

void DataLoader::startPrefetch() {
  if (options_.prefetch == 0) return;
  prefetcher_ = std::make_unique<Prefetcher>();
  Prefetcher* p = prefetcher_.get();
  const LoaderState start = state_;
  p->worker = std::thread([this, p, start] {
    trace::setThreadName("data loader");
    LoaderState position = start;
    const int64_t perEpoch = batchesPerEpoch();
    while (true) {
      {
        std::unique_lock lock(p->mutex);
        p->changed.wait(
            lock, [&] { return p->stop || static_cast<int>(p->ready.size()) < options_.prefetch; });
        if (p->stop) return;
      }
      Prefetcher::Item item;
      item.position = position;
      try {
        trace::Scope span("gather batch", "data");
        span.index(position.batch);
        item.batch = gatherAt(position.epoch, position.batch);
      } catch (...) {
        item.error = std::current_exception();
      }
      const bool failed = item.error != nullptr;
      {
        std::lock_guard lock(p->mutex);
        p->ready.push_back(std::move(item));
      }
      p->changed.notify_all();
      if (failed) return;
      if (++position.batch == perEpoch) position = {position.epoch + 1, 0};
    }
  });
}

void DataLoader::stopPrefetch() {
  if (!prefetcher_) return;
  {
    std::lock_guard lock(prefetcher_->mutex);
    prefetcher_->stop = true;
  }
  prefetcher_->changed.notify_all();
  if (prefetcher_->worker.joinable()) prefetcher_->worker.join();
  prefetcher_.reset();
}

bool DataLoader::next(Batch& batch) {
  if (state_.batch >= batchesPerEpoch()) {
    state_ = {state_.epoch + 1, 0};
    return false;
  }
  if (!prefetcher_) {
    batch = gatherAt(state_.epoch, state_.batch);
  } else {
    Prefetcher::Item item;
    {
      std::unique_lock lock(prefetcher_->mutex);
      prefetcher_->changed.wait(lock, [&] { return !prefetcher_->ready.empty(); });
      // A failed gather stays at the front, so every later call reports it again.
      if (prefetcher_->ready.front().error)
        std::rethrow_exception(prefetcher_->ready.front().error);
      item = std::move(prefetcher_->ready.front());
      prefetcher_->ready.pop_front();
    }
    prefetcher_->changed.notify_all();
    KOLO_CHECK(item.position.epoch == state_.epoch && item.position.batch == state_.batch,
               "DataLoader prefetch out of order");
    batch = std::move(item.batch);
  }
  ++state_.batch;
  return true;
}

void DataLoader::setState(const LoaderState& state) {
  KOLO_REQUIRE(state.epoch >= 0 && state.batch >= 0 && state.batch <= batchesPerEpoch(),
               "DataLoader state epoch ", state.epoch, " batch ", state.batch, " (",
               batchesPerEpoch(), " batches per epoch)");
  stopPrefetch();
  state_ = state;
  if (state_.batch == batchesPerEpoch()) state_ = {state_.epoch + 1, 0};
  startPrefetch();
}

}  // namespace kolo::data
