// ByteCorpus: a text file's bytes or a token file's tokens, its seeded random windows and its
// windows in file order.
#include "kolo/byte_corpus.h"

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iterator>

#include "data/mapped_file.h"
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
    : source_(source) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  tokens_ = owned->data();
  count_ = static_cast<int64_t>(owned->size());
  owner_ = std::move(owned);
  split(seqLen, heldOutFraction);
}

ByteCorpus::ByteCorpus(const std::string& path, TokenFileOptions options, int64_t seqLen, double heldOutFraction)
    : source_(path) {
  std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  width_ = options.type == TokenType::U8 ? 1 : options.type == TokenType::U16 ? 2 : 4;
  if (file->size() % static_cast<size_t>(width_) != 0)
    KOLO_THROW(FormatError, "token file ", path, " holds ", file->size(), " bytes, not a whole number of ",
               width_ * 8, "-bit tokens (truncated, or tokens of another type)");
  tokens_ = file->data();
  count_ = static_cast<int64_t>(file->size()) / width_;
  owner_ = std::move(file);
  KOLO_REQUIRE(options.vocab >= 0, "token file ", path, ": the vocabulary must be positive, got ", options.vocab);
  vocab_ = options.vocab;
  if (vocab_ == 0) {
    int64_t largest = 0;
    for (int64_t i = 0; i < count_; ++i) largest = std::max(largest, tokenAt(i));
    vocab_ = largest + 1;
  }
  split(seqLen, heldOutFraction);
}

void ByteCorpus::split(int64_t seqLen, double heldOutFraction) {
  const std::string& source = source_;
  seqLen_ = seqLen;
  KOLO_REQUIRE(seqLen > 0, "text ", source, ": the sequence length must be at least 1, got ", seqLen);
  KOLO_REQUIRE(heldOutFraction >= 0.0 && heldOutFraction <= 0.5, "text ", source,
               ": the held-out fraction must be in [0, 0.5], got ", heldOutFraction);
  const int64_t n = count_;
  const int64_t window = seqLen + 1;
  KOLO_REQUIRE(n >= 2 * window, "text ", source, " has ", n, " tokens, too few for windows of ", window,
               " tokens (sequence length ", seqLen, "); it needs at least ", 2 * window);
  int64_t heldOut = static_cast<int64_t>(static_cast<double>(n) * heldOutFraction);
  if (heldOutFraction > 0.0 && heldOut < window) heldOut = window;
  trainEnd_ = n - heldOut;
}

int64_t ByteCorpus::tokenAt(int64_t i) const {
  const uint8_t* p = tokens_ + i * width_;
  switch (width_) {
    case 1: return p[0];
    case 2: return int64_t(p[0]) | (int64_t(p[1]) << 8);
    default: return int64_t(p[0]) | (int64_t(p[1]) << 8) | (int64_t(p[2]) << 16) | (int64_t(p[3]) << 24);
  }
}

Batch ByteCorpus::batch(int64_t step, int64_t batchSize, uint64_t seed, bool heldOut) const {
  KOLO_REQUIRE(batchSize > 0, "text ", source_, ": batch size must be at least 1, got ", batchSize);
  const int64_t begin = heldOut ? trainEnd_ : 0;
  const int64_t end = heldOut ? count_ : trainEnd_;
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
    for (int64_t t = 0; t <= seqLen_; ++t) {
      const int64_t token = tokenAt(start + t);
      if (token >= vocab_)
        KOLO_THROW(FormatError, "token file ", source_, ": token ", start + t, " is ", token,
                   ", not below the vocabulary of ", vocab_);
      if (t < seqLen_) inputs.push_back(token);
      if (t > 0) labels.push_back(token);
    }
  }
  Batch out;
  out.inputs = Tensor::fromVector({batchSize, seqLen_}, inputs);
  out.labels = Tensor::fromVector({batchSize, seqLen_}, labels);
  return out;
}

std::string ByteCorpus::text(int64_t offset, int64_t count) const {
  const int64_t begin = std::min(count_, std::max<int64_t>(offset, 0));
  const int64_t n = std::min(count_ - begin, std::max<int64_t>(count, 0));
  std::string text;
  for (int64_t i = begin; i < begin + n; ++i) text.push_back(static_cast<char>(tokenAt(i) & 0xff));
  return text;
}

}  // namespace kolo::data
