// Byte-level text for the `lm` model: a file read whole into memory, split into a training
// and a held-out part, and batches of random windows whose positions depend only on the
// seed and the step (so any rank, and a resumed run, draws the same batch for a step).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/data.h"

namespace kolo::data {

class ByteCorpus {
 public:
  /// Reads `path` whole; the last `heldOutFraction` of its bytes (at least seqLen + 1 of
  /// them) form the held-out part. Throws FileError naming the file when it cannot be read,
  /// InvalidArgument when it is too short for two windows of `seqLen` + 1 bytes or the
  /// fraction is outside [0, 0.5].
  ByteCorpus(const std::string& path, int64_t seqLen, double heldOutFraction = 0.1);
  /// From bytes already in memory (tests); `source` names them in messages.
  ByteCorpus(std::vector<uint8_t> bytes, int64_t seqLen, double heldOutFraction, const std::string& source);

  /// Global batch of step `step`: inputs (B, T) and labels (B, T), i64, labels shifted by one
  /// byte; window starts drawn uniformly from the training part by a generator seeded from
  /// (seed, step). `heldOut` draws from the held-out part instead.
  Batch batch(int64_t step, int64_t batchSize, uint64_t seed, bool heldOut = false) const;

  int64_t seqLen() const { return seqLen_; }
  int64_t trainBytes() const { return trainEnd_; }
  int64_t heldOutBytes() const { return static_cast<int64_t>(bytes_.size()) - trainEnd_; }
  const std::string& source() const { return source_; }
  /// `count` bytes from `offset` on (clipped to the file), as text: a prompt for sampling.
  std::string text(int64_t offset, int64_t count) const;

 private:
  std::vector<uint8_t> bytes_;
  int64_t seqLen_;
  int64_t trainEnd_ = 0;
  std::string source_;
};

}  // namespace kolo::data
