// Token streams for the `lm` model: a text's bytes read whole into memory, or a file of
// little-endian u16/u32 tokens (nanoGPT's and Megatron's .bin) memory-mapped; split into a
// training and a held-out part, and batches of windows whose positions depend only on the step
// (and the seed, when drawn at random), so any rank, and a resumed run, gets the same batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/data.h"

namespace kolo::data {

/// The element type of a token file: one little-endian unsigned integer per token.
enum class TokenType { U8, U16, U32 };

/// A token file as ByteCorpus reads it.
struct TokenFileOptions {
  TokenType type = TokenType::U16;
  /// The vocabulary: every token must be below it. 0: one more than the file's largest token
  /// (found by reading the file once at open).
  int64_t vocab = 0;
};

/// A stream of tokens (a text's bytes, or a token file's tokens) cut into windows.
class ByteCorpus {
 public:
  /// Reads `path` whole; the last `heldOutFraction` of its bytes (at least seqLen + 1 of
  /// them) form the held-out part. Throws FileError naming the file when it cannot be read,
  /// InvalidArgument when it is too short for two windows of `seqLen` + 1 bytes or the
  /// fraction is outside [0, 0.5].
  ByteCorpus(const std::string& path, int64_t seqLen, double heldOutFraction = 0.1);
  /// From bytes already in memory (tests); `source` names them in messages.
  ByteCorpus(std::vector<uint8_t> bytes, int64_t seqLen, double heldOutFraction, const std::string& source);
  /// The tokens of the file `path`, memory-mapped: split, cut and batched as a text's bytes are
  /// (a file of u8 tokens, or of u16 tokens that are a text's bytes, gives the batches of that
  /// text). Throws FileError when it cannot be read, FormatError naming the file when its
  /// length is not a whole number of tokens (truncated, or another type), InvalidArgument as
  /// above when it is too short, or when a token is not below options.vocab (naming the
  /// token's position; checked as windows are read).
  ByteCorpus(const std::string& path, TokenFileOptions options, int64_t seqLen, double heldOutFraction = 0.1);

  /// Global batch of step `step`: inputs (B, T) and labels (B, T), i64, labels shifted by one
  /// byte; window starts drawn uniformly from the training part by a generator seeded from
  /// (seed, step). `heldOut` draws from the held-out part instead.
  Batch batch(int64_t step, int64_t batchSize, uint64_t seed, bool heldOut = false) const;

  /// Global batch of step `step` in file order (`kolo train --model lm --no-shuffle`), so that
  /// any other implementation can feed the same batches. The part is cut into W =
  /// windows(heldOut) windows seqLen bytes apart (window w: inputs are bytes [w*T, w*T + T) of
  /// the part, labels one byte further), and an epoch is E = W / B steps: row i of step s is
  /// window (s mod E) * B + i, so in the first epoch the window starting at byte (s*B + i)*T.
  /// At the end of the part the last W mod B windows, too few for a full batch, are skipped
  /// and step E starts again at byte 0 (as a data loader with drop_last). Throws
  /// InvalidArgument when the part holds fewer than B windows, naming the text and both counts.
  Batch fileOrderBatch(int64_t step, int64_t batchSize, bool heldOut = false) const;
  /// Windows of seqLen + 1 bytes starting seqLen apart that fit in the training (or held-out)
  /// part: (bytes - 1) / seqLen.
  int64_t windows(bool heldOut = false) const;

  int64_t seqLen() const { return seqLen_; }
  /// Tokens of the training and held-out parts (a text's bytes).
  int64_t trainBytes() const { return trainEnd_; }
  int64_t heldOutBytes() const { return count_ - trainEnd_; }
  /// Tokens are below this: 256 for a text's bytes.
  int64_t vocab() const { return vocab_; }
  const std::string& source() const { return source_; }
  /// `count` tokens from `offset` on (clipped to the file), as text (each token a byte; only
  /// meaningful for a text or a vocabulary of 256): a prompt for sampling.
  std::string text(int64_t offset, int64_t count) const;
  /// The batch of the windows numbered `indices` of the training (or held-out) part (window
  /// w: inputs are bytes [w*T, w*T + T) of the part, as in fileOrderBatch). Throws
  /// InvalidArgument for an index outside [0, windows()).
  Batch windowBatch(const std::vector<int64_t>& indices, bool heldOut = false) const;

 private:
  // The batch of the windows starting at `starts` (offsets into the whole file).
  Batch gather(const std::vector<int64_t>& starts) const;
  // Checks the length and sets the split (both constructors).
  void split(int64_t seqLen, double heldOutFraction);
  int64_t tokenAt(int64_t i) const;

  std::shared_ptr<const void> owner_;  // the text's bytes, or the token file's mapping
  const uint8_t* tokens_ = nullptr;
  int64_t count_ = 0;
  int width_ = 1;  // bytes per token
  int64_t vocab_ = 256;
  int64_t seqLen_ = 0;
  int64_t trainEnd_ = 0;
  std::string source_;
};

/// The windows of a ByteCorpus part as a Dataset (sample w: window w, see fileOrderBatch), so
/// that train::fit's loader draws them: in file order, a global batch s holds the windows
/// fileOrderBatch(s) holds; shuffled, a seeded permutation of them each epoch.
class ByteWindows : public Dataset {
 public:
  explicit ByteWindows(std::shared_ptr<const ByteCorpus> corpus, bool heldOut = false);
  int64_t size() const override;
  Batch gather(const std::vector<int64_t>& indices) const override;

 private:
  std::shared_ptr<const ByteCorpus> corpus_;
  bool heldOut_;
};

}  // namespace kolo::data
