// ByteCorpus: a text file as bytes, its seeded random windows and its windows in file order.
#include "kolo/byte_corpus.h"

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iterator>

#include "kolo/error.h"

namespace kolo::data {

namespace {
std::vector<uint8_t> readWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) KOLO_THROW(FileError, "cannot open text file ", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) KOLO_THROW(FileError, "cannot read text file ", path);
  return bytes;
}
}  // namespace

ByteCorpus::ByteCorpus(const std::string& path, int64_t seqLen, double heldOutFraction)
    : ByteCorpus(readWhole(path), seqLen, heldOutFraction, path) {}

ByteCorpus::ByteCorpus(std::vector<uint8_t> bytes, int64_t seqLen, double heldOutFraction,
                       const std::string& source)
    : bytes_(std::move(bytes)), seqLen_(seqLen), source_(source) {
  KOLO_REQUIRE(seqLen > 0, "text ", source, ": the sequence length must be at least 1, got ", seqLen);
  KOLO_REQUIRE(heldOutFraction >= 0.0 && heldOutFraction <= 0.5, "text ", source,
               ": the held-out fraction must be in [0, 0.5], got ", heldOutFraction);
  const int64_t n = static_cast<int64_t>(bytes_.size());
  const int64_t window = seqLen + 1;
  KOLO_REQUIRE(n >= 2 * window, "text ", source, " has ", n, " bytes, too few for windows of ", window,
               " bytes (--seq-len ", seqLen, "); it needs at least ", 2 * window);
  int64_t heldOut = static_cast<int64_t>(static_cast<double>(n) * heldOutFraction);
  if (heldOutFraction > 0.0 && heldOut < window) heldOut = window;
  trainEnd_ = n - heldOut;
}

Batch ByteCorpus::batch(int64_t step, int64_t batchSize, uint64_t seed, bool heldOut) const {
  KOLO_REQUIRE(batchSize > 0, "text ", source_, ": batch size must be at least 1, got ", batchSize);
  const int64_t begin = heldOut ? trainEnd_ : 0;
  const int64_t end = heldOut ? static_cast<int64_t>(bytes_.size()) : trainEnd_;
  KOLO_REQUIRE(end - begin >= seqLen_ + 1, "text ", source_, ": the ", heldOut ? "held-out" : "training",
               " part has no window of ", seqLen_ + 1, " bytes");
  const int64_t starts = end - begin - seqLen_;  // window starts in [begin, begin + starts)
  Generator gen(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step) * 2 + (heldOut ? 1 : 0));
  std::vector<int64_t> rows(static_cast<size_t>(batchSize));
  for (auto& start : rows) start = begin + static_cast<int64_t>(gen.nextU64() % static_cast<uint64_t>(starts));
  return gather(rows);
}

int64_t ByteCorpus::windows(bool heldOut) const {
  const int64_t bytes = heldOut ? heldOutBytes() : trainBytes();
  return bytes > seqLen_ ? (bytes - 1) / seqLen_ : 0;
}

Batch ByteCorpus::fileOrderBatch(int64_t step, int64_t batchSize, bool heldOut) const {
  KOLO_REQUIRE(batchSize > 0, "text ", source_, ": batch size must be at least 1, got ", batchSize);
  KOLO_REQUIRE(step >= 0, "text ", source_, ": step ", step, " is negative");
  const int64_t count = windows(heldOut);
  KOLO_REQUIRE(count >= batchSize, "text ", source_, ": the ", heldOut ? "held-out" : "training", " part (",
               heldOut ? heldOutBytes() : trainBytes(), " bytes) holds ", count, " windows of ", seqLen_ + 1,
               " bytes in file order, fewer than the batch of ", batchSize);
  const int64_t begin = heldOut ? trainEnd_ : 0;
  const int64_t first = step % (count / batchSize) * batchSize;  // window of row 0
  std::vector<int64_t> rows(static_cast<size_t>(batchSize));
  for (int64_t i = 0; i < batchSize; ++i) rows[static_cast<size_t>(i)] = begin + (first + i) * seqLen_;
  return gather(rows);
}

Batch ByteCorpus::windowBatch(const std::vector<int64_t>& indices, bool heldOut) const {
  const int64_t count = windows(heldOut);
  const int64_t begin = heldOut ? trainEnd_ : 0;
  std::vector<int64_t> starts;
  starts.reserve(indices.size());
  for (const int64_t w : indices) {
    KOLO_REQUIRE(w >= 0 && w < count, "text ", source_, ": window ", w, " is not among the ",
                 heldOut ? "held-out" : "training", " part's ", count);
    starts.push_back(begin + w * seqLen_);
  }
  Batch batch = gather(starts);
  batch.indices = indices;
  return batch;
}

ByteWindows::ByteWindows(std::shared_ptr<const ByteCorpus> corpus, bool heldOut)
    : corpus_(std::move(corpus)), heldOut_(heldOut) {
  KOLO_REQUIRE(corpus_ != nullptr, "ByteWindows: no corpus");
}

int64_t ByteWindows::size() const { return corpus_->windows(heldOut_); }

Batch ByteWindows::gather(const std::vector<int64_t>& indices) const {
  return corpus_->windowBatch(indices, heldOut_);
}

Batch ByteCorpus::gather(const std::vector<int64_t>& starts) const {
  const int64_t batchSize = static_cast<int64_t>(starts.size());
  std::vector<int64_t> inputs, labels;
  inputs.reserve(static_cast<size_t>(batchSize * seqLen_));
  labels.reserve(inputs.capacity());
  for (const int64_t start : starts) {
    for (int64_t t = 0; t < seqLen_; ++t) {
      inputs.push_back(bytes_[static_cast<size_t>(start + t)]);
      labels.push_back(bytes_[static_cast<size_t>(start + t + 1)]);
    }
  }
  Batch out;
  out.inputs = Tensor::fromVector({batchSize, seqLen_}, inputs);
  out.labels = Tensor::fromVector({batchSize, seqLen_}, labels);
  return out;
}

std::string ByteCorpus::text(int64_t offset, int64_t count) const {
  const size_t begin = std::min(bytes_.size(), static_cast<size_t>(std::max<int64_t>(offset, 0)));
  const size_t n = std::min(bytes_.size() - begin, static_cast<size_t>(std::max<int64_t>(count, 0)));
  return std::string(bytes_.begin() + static_cast<std::ptrdiff_t>(begin),
                     bytes_.begin() + static_cast<std::ptrdiff_t>(begin + n));
}

}  // namespace kolo::data
