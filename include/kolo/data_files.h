// Datasets read from the files users export: CSV/TSV tables with a header and a label column,
// NumPy .npy arrays (memory-mapped) and .npz archives, per-feature standardisation whose
// statistics come from the training split, and the split helpers (by fraction, by index).
// Every reader checks lengths before it allocates and names the file and the record (line,
// array, member) in its errors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/data.h"

namespace kolo::data {

namespace detail {
class MappedFile;
}

/// Options of readCsv.
struct CsvOptions {
  /// The header's name of the column holding the labels; every other column is a feature.
  std::string labelColumn = "label";
  /// The field separator; 0 picks a tab for a file whose name ends in .tsv, else a comma.
  char delimiter = 0;
  /// The classes of string labels, in class order: the training split's (CsvTable::classNames),
  /// so that a test split maps its labels alike. Empty: integer labels are classes as they
  /// are, and string labels are mapped to classes in sorted order.
  std::vector<std::string> classNames{};
};

/// A CSV/TSV file read whole: features f32 [N, F] in the header's order (the label column
/// left out) and labels i64 [N].
struct CsvTable {
  Tensor inputs;
  Tensor labels;
  std::vector<std::string> featureNames;
  /// The class names when the labels are strings (class i is classNames[i]); empty when the
  /// labels are integers.
  std::vector<std::string> classNames;
  /// One more than the largest class (string labels: classNames.size()).
  int64_t classes = 0;
};

/// Reads a CSV/TSV file with a header line. Fields may be quoted ("a, b" and "" inside);
/// blank lines and a final line without a newline are accepted, as are CRLF line ends.
/// Labels that are all non-negative integers are classes as they are; otherwise they are
/// strings mapped to classes in sorted order (or by options.classNames). Throws FileError when
/// the file cannot be read, FormatError naming the file and line (path:LINE) for a row with
/// another number of fields than the header, a missing (empty) or non-numeric or non-finite
/// feature, naming the column too; for a header without options.labelColumn (listing the
/// columns), a label not among options.classNames, or a file without rows.
CsvTable readCsv(const std::string& path, const CsvOptions& options = {});

/// A NumPy array's element type, as the .npy header's descr names it (little-endian).
enum class NpyType { F32, F64, U8, I32, I64 };

/// One NumPy array: its shape and its C-order elements, read in place from a memory-mapped
/// .npy file or a stored .npz member (a compressed member is inflated into memory). Copies
/// share the bytes.
class NpyArray {
 public:
  NpyArray() = default;
  const std::vector<int64_t>& shape() const { return shape_; }
  NpyType type() const { return type_; }
  /// Elements in all (the product of the shape).
  int64_t numel() const { return numel_; }
  /// What the array is called in messages: the file, or ARCHIVE:MEMBER for an .npz member.
  const std::string& source() const { return source_; }
  /// Elements [begin, begin + count) converted to f32 into `out`.
  void copyF32(int64_t begin, int64_t count, float* out) const;
  /// Asks the CPU to start loading elements [begin, begin + count) (no effect on values).
  void prefetch(int64_t begin, int64_t count) const;
  /// Element `index` as an integer; throws FormatError naming the array and the index when a
  /// floating-point element is not a whole number.
  int64_t integerAt(int64_t index) const;

 private:
  friend NpyArray parseNpy(std::shared_ptr<const void>, const uint8_t*, size_t, const std::string&);
  std::shared_ptr<const void> owner_;  // keeps the mapping or the inflated bytes
  const uint8_t* elements_ = nullptr;
  std::vector<int64_t> shape_;
  NpyType type_ = NpyType::F32;
  int64_t numel_ = 0;
  std::string source_;
};

/// Parses the .npy bytes [data, data + size) that `owner` keeps alive; `source` names them in
/// messages. Format versions 1.0, 2.0 and 3.0; C order; little-endian f4, f8, u1, i4, i8 (and
/// b1 as u1). Throws FormatError naming the source for a bad magic or header, another dtype
/// (naming it), Fortran order, or fewer bytes than the shape needs (truncated).
NpyArray parseNpy(std::shared_ptr<const void> owner, const uint8_t* data, size_t size, const std::string& source);

/// Maps `path` and parses it as .npy (parseNpy). Throws FileError when it cannot be read.
NpyArray loadNpy(const std::string& path);

/// The arrays of an .npz archive (numpy.savez or savez_compressed), by name without ".npy",
/// in the archive's order. Stored members are read in place; deflated ones are inflated, each
/// no larger than its recorded size. Throws FileError when the file cannot be read,
/// FormatError naming the archive (and member) when it is not a zip archive, a member is
/// truncated or uses another compression, or a member is not an .npy array.
std::vector<std::pair<std::string, NpyArray>> loadNpz(const std::string& path);

/// Samples from two NumPy arrays, read where they lie at each gather: inputs [N, ...] of any
/// supported type converted to f32, labels [N] of integers (or whole floats).
class NpyDataset : public Dataset {
 public:
  /// Throws FormatError naming both arrays when their first dimensions differ, the labels
  /// are not one-dimensional, or a label is negative or not a whole number (naming its index).
  NpyDataset(NpyArray inputs, NpyArray labels);
  int64_t size() const override;
  Batch gather(const std::vector<int64_t>& indices) const override;
  /// One more than the largest label.
  int64_t classes() const { return classes_; }
  /// The shape of one sample (the inputs' shape without its first dimension).
  Shape sampleShape() const;

 private:
  NpyArray inputs_, labels_;
  std::vector<int64_t> labelValues_;
  int64_t rowElements_ = 0;
  int64_t classes_ = 0;
};

/// The NumPy dataset of `inputsPath` and `labelsPath` (.npy each), or of one .npz archive
/// holding both (labelsPath empty): the arrays named x and y, X and y, inputs and labels,
/// images and labels, or data and labels. Throws what loadNpy/loadNpz/NpyDataset throw, and
/// FormatError listing the archive's arrays when none of those pairs is in it.
std::shared_ptr<NpyDataset> loadNpyDataset(const std::string& inputsPath, const std::string& labelsPath = "");

/// Per-feature standardisation: x' = (x - mean) / std, with the statistics of one dataset
/// (the training split's), applied to any split.
struct Standardizer {
  std::vector<double> mean;
  std::vector<double> stddev;  // a constant feature's is 1, so it maps to 0

  /// The mean and (population) standard deviation of every input element over `dataset`,
  /// read in chunks through gather. Throws InvalidArgument for an empty dataset.
  static Standardizer fit(const Dataset& dataset);
  /// Standardises `inputs` (f32 [B, ...], mean.size() elements per sample) in place. Throws
  /// InvalidArgument naming both counts when a sample has another number of elements.
  void apply(Tensor& inputs) const;
  /// As text ("mean1,mean2,...;std1,std2,...", shortest round-trip decimals), to store with a
  /// checkpoint, and back. parse throws FormatError naming `source` for malformed text.
  std::string toString() const;
  static Standardizer parse(const std::string& text, const std::string& source);
};

/// `base` with a Standardizer applied to every batch it gathers.
class StandardizedDataset : public Dataset {
 public:
  StandardizedDataset(std::shared_ptr<const Dataset> base, Standardizer standardizer);
  int64_t size() const override { return base_->size(); }
  Batch gather(const std::vector<int64_t>& indices) const override;
  Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  std::vector<int64_t> shuffledOrder(uint64_t seed, int64_t epoch) const override;
  const Standardizer& standardizer() const { return standardizer_; }

 private:
  std::shared_ptr<const Dataset> base_;
  Standardizer standardizer_;
};

/// The samples of `base` at `indices` (each in [0, base.size())), as a dataset of their own:
/// sample i is base's sample indices[i]. Throws InvalidArgument naming an index out of range.
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Batch gather(const std::vector<int64_t>& indices) const override;
  Batch gatherForEpoch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

/// What a path given as a dataset holds.
enum class DataPathKind { FashionMnist, Table, NumPy, ImageFolder, Shards };

/// The kind of dataset `path` names, from its name and what is there: a comma-separated list
/// or a glob ("DIR/*.npz") names Shards (openShards); a .csv/.tsv file a Table (readCsv);
/// .npy/.npz NumPy (loadNpyDataset); kFashionMnistDir, a directory holding
/// train-images-idx3-ubyte.gz, or a path that does not exist FashionMnist (whose reader then
/// names the missing directory and its Debian package); any other directory an ImageFolder.
/// Throws InvalidArgument naming the path and the kinds for anything else.
DataPathKind dataPathKind(const std::string& path);

/// A train/test split of one dataset.
struct Split {
  std::shared_ptr<Subset> train;
  std::shared_ptr<Subset> test;
};

/// Splits `dataset` into a training part and a test part holding `testFraction` of its samples
/// (rounded down, at least one of each): with `shuffle`, by the seeded permutation
/// epochPermutation(n, seed, 0) (the test part is its last samples); without, in file order
/// (the test part is the last samples of the file). Throws InvalidArgument when the fraction
/// is outside (0, 1) or the dataset has fewer than two samples.
Split splitDataset(std::shared_ptr<const Dataset> dataset, double testFraction, bool shuffle = true,
                   uint64_t seed = 0);

}  // namespace kolo::data
