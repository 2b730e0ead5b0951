// NumPy files: the .npy header parsed and checked against the file's length before any
// element is read, .npz archives walked through their zip central directory, and the
// dataset that reads two such arrays where they lie.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/mapped_file.h"
#include "kolo/data_files.h"
#include "kolo/error.h"

namespace kolo::data {
namespace {

// Larger element counts are refused as implausible (and keep every product of dimensions
// far from overflowing int64).
constexpr uint64_t kMaxNpyElements = uint64_t(1) << 40;

int elementBytes(NpyType type) {
  switch (type) {
    case NpyType::F32: return 4;
    case NpyType::F64: return 8;
    case NpyType::U8: return 1;
    case NpyType::I32: return 4;
    case NpyType::I64: return 8;
  }
  return 1;
}

uint16_t littleEndian16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t littleEndian32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// The value of `key` in the header's Python dict literal: the text after "'key':" up to the
// next top-level comma or the closing brace.
std::string dictValue(const std::string& header, const std::string& key, const std::string& source) {
  const std::string quoted = "'" + key + "'";
  size_t at = header.find(quoted);
  if (at == std::string::npos) KOLO_THROW(FormatError, source, ": the .npy header has no '", key, "': ", header);
  at = header.find(':', at + quoted.size());
  if (at == std::string::npos) KOLO_THROW(FormatError, source, ": malformed .npy header: ", header);
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  size_t end = at;
  int depth = 0;
  while (end < header.size()) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    ++end;
  }
  return header.substr(at, end - at);
}

std::vector<int64_t> parseShape(const std::string& text, const std::string& source) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    KOLO_THROW(FormatError, source, ": malformed .npy shape ", text);
  std::vector<int64_t> shape;
  size_t i = 1;
  while (i < text.size() - 1) {
    while (i < text.size() - 1 && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size() - 1) break;
    int64_t dim = 0;
    bool digits = false;
    while (i < text.size() - 1 && text[i] >= '0' && text[i] <= '9') {
      if (dim > int64_t(kMaxNpyElements)) KOLO_THROW(FormatError, source, ": .npy dimension in ", text, " is implausibly large");
      dim = dim * 10 + (text[i] - '0');
      digits = true;
      ++i;
    }
    if (!digits) KOLO_THROW(FormatError, source, ": malformed .npy shape ", text);
    shape.push_back(dim);
  }
  return shape;
}

}  // namespace

NpyArray parseNpy(std::shared_ptr<const void> owner, const uint8_t* data, size_t size, const std::string& source) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(data, kMagic, 6) != 0)
    KOLO_THROW(FormatError, source, ": not a NumPy .npy file (", size < 10 ? "too short for" : "no", " \\x93NUMPY magic)");
  const int major = data[6];
  size_t headerLength = 0;
  size_t headerStart = 0;
  if (major == 1) {
    headerLength = littleEndian16(data + 8);
    headerStart = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) KOLO_THROW(FormatError, source, ": truncated .npy header");
    headerLength = littleEndian32(data + 8);
    headerStart = 12;
  } else {
    KOLO_THROW(FormatError, source, ": .npy format version ", major, ".", int(data[7]), " is not supported (1.0 to 3.0)");
  }
  if (headerLength > size - headerStart)
    KOLO_THROW(FormatError, source, ": truncated .npy file (the header declares ", headerLength, " bytes, ",
               size - headerStart, " follow)");
  const std::string header(reinterpret_cast<const char*>(data + headerStart), headerLength);
  std::string descr = dictValue(header, "descr", source);
  const std::string fortran = dictValue(header, "fortran_order", source);
  if (fortran != "False")
    KOLO_THROW(FormatError, source, ": the array is in Fortran order; save it in C order (numpy.ascontiguousarray)");
  NpyArray array;
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"')) descr = descr.substr(1, descr.size() - 2);
  if (descr == "<f4") array.type_ = NpyType::F32;
  else if (descr == "<f8") array.type_ = NpyType::F64;
  else if (descr == "|u1" || descr == "|b1") array.type_ = NpyType::U8;
  else if (descr == "<i4") array.type_ = NpyType::I32;
  else if (descr == "<i8") array.type_ = NpyType::I64;
  else
    KOLO_THROW(FormatError, source, ": NumPy dtype '", descr,
               "' is not supported (little-endian float32, float64, uint8, int32, int64 or bool)");
  array.shape_ = parseShape(dictValue(header, "shape", source), source);
  uint64_t count = 1;
  for (const int64_t dim : array.shape_) {
    if (dim != 0 && count > kMaxNpyElements / uint64_t(dim))
      KOLO_THROW(FormatError, source, ": .npy shape is implausibly large");
    count *= uint64_t(dim);
  }
  const uint64_t payload = size - headerStart - headerLength;
  const uint64_t needed = count * uint64_t(elementBytes(array.type_));
  if (payload < needed)
    KOLO_THROW(FormatError, source, ": truncated .npy data: shape ", shapeString(array.shape_), " of ", descr, " needs ",
               needed, " bytes, the file holds ", payload);
  array.owner_ = std::move(owner);
  array.elements_ = data + headerStart + headerLength;
  array.numel_ = static_cast<int64_t>(count);
  array.source_ = source;
  return array;
}

void NpyArray::copyF32(int64_t begin, int64_t count, float* out) const {
  KOLO_REQUIRE(begin >= 0 && count >= 0 && begin + count <= numel_, source_, ": elements [", begin, ", ",
               begin + count, ") are outside the array's ", numel_);
  // Elements may be unaligned inside an .npz member: read them through memcpy.
  const uint8_t* from = elements_ + begin * elementBytes(type_);
  switch (type_) {
    case NpyType::F32: std::memcpy(out, from, size_t(count) * 4); break;
    case NpyType::F64:
      for (int64_t i = 0; i < count; ++i) {
        double v;
        std::memcpy(&v, from + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      break;
    case NpyType::U8:
      for (int64_t i = 0; i < count; ++i) out[i] = from[i];
      break;
    case NpyType::I32:
      for (int64_t i = 0; i < count; ++i) {
        int32_t v;
        std::memcpy(&v, from + 4 * i, 4);
        out[i] = static_cast<float>(v);
      }
      break;
    case NpyType::I64:
      for (int64_t i = 0; i < count; ++i) {
        int64_t v;
        std::memcpy(&v, from + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      break;
  }
}

int64_t NpyArray::integerAt(int64_t index) const {
  KOLO_REQUIRE(index >= 0 && index < numel_, source_, ": element ", index, " is outside the array's ", numel_);
  const uint8_t* from = elements_ + index * elementBytes(type_);
  switch (type_) {
    case NpyType::U8: return *from;
    case NpyType::I32: {
      int32_t v;
      std::memcpy(&v, from, 4);
      return v;
    }
    case NpyType::I64: {
      int64_t v;
      std::memcpy(&v, from, 8);
      return v;
    }
    case NpyType::F32:
    case NpyType::F64: {
      double v;
      if (type_ == NpyType::F32) {
        float f;
        std::memcpy(&f, from, 4);
        v = f;
      } else {
        std::memcpy(&v, from, 8);
      }
      if (!(std::floor(v) == v && std::fabs(v) < 9.0e15))
        KOLO_THROW(FormatError, source_, ": element ", index, " is ", v, ", not a whole number (a class label)");
      return static_cast<int64_t>(v);
    }
  }
  return 0;
}

NpyArray loadNpy(const std::string& path) {
  std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  const uint8_t* data = file->data();
  const size_t size = file->size();
  return parseNpy(std::move(file), data, size, path);
}

std::vector<std::pair<std::string, NpyArray>> loadNpz(const std::string& path) {
  std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  const uint8_t* data = file->data();
  const size_t size = file->size();
  // The end-of-central-directory record: the last 22 bytes, or further back past a comment.
  constexpr size_t kEocd = 22;
  if (size < kEocd) KOLO_THROW(FormatError, path, ": not an .npz (zip) archive: ", size, " bytes");
  size_t eocd = size - kEocd;
  const size_t lowest = size > kEocd + 65535 ? size - kEocd - 65535 : 0;
  while (littleEndian32(data + eocd) != 0x06054b50) {
    if (eocd == lowest) KOLO_THROW(FormatError, path, ": not an .npz (zip) archive: no end of central directory");
    --eocd;
  }
  const uint32_t entries = littleEndian16(data + eocd + 10);
  const uint64_t directorySize = littleEndian32(data + eocd + 12);
  const uint64_t directoryAt = littleEndian32(data + eocd + 16);
  if (directoryAt == 0xffffffffu || entries == 0xffff)
    KOLO_THROW(FormatError, path, ": a zip64 archive (over 4 GiB); save the arrays as .npy files instead");
  if (directoryAt + directorySize > eocd)
    KOLO_THROW(FormatError, path, ": truncated .npz archive (the central directory lies past the end)");
  std::vector<std::pair<std::string, NpyArray>> arrays;
  size_t at = directoryAt;
  for (uint32_t e = 0; e < entries; ++e) {
    if (at + 46 > eocd || littleEndian32(data + at) != 0x02014b50)
      KOLO_THROW(FormatError, path, ": corrupt .npz central directory at entry ", e);
    const uint16_t method = littleEndian16(data + at + 10);
    const uint64_t compressed = littleEndian32(data + at + 20);
    const uint64_t uncompressed = littleEndian32(data + at + 24);
    const size_t nameLength = littleEndian16(data + at + 28);
    const size_t extraLength = littleEndian16(data + at + 30);
    const size_t commentLength = littleEndian16(data + at + 32);
    const uint64_t localAt = littleEndian32(data + at + 42);
    if (at + 46 + nameLength > eocd) KOLO_THROW(FormatError, path, ": corrupt .npz central directory at entry ", e);
    std::string name(reinterpret_cast<const char*>(data + at + 46), nameLength);
    at += 46 + nameLength + extraLength + commentLength;
    const std::string source = path + ":" + name;
    if (compressed == 0xffffffffu || uncompressed == 0xffffffffu || localAt == 0xffffffffu)
      KOLO_THROW(FormatError, source, ": a zip64 member (over 4 GiB); save the arrays as .npy files instead");
    if (localAt + 30 > size || littleEndian32(data + localAt) != 0x04034b50)
      KOLO_THROW(FormatError, source, ": corrupt .npz member header");
    const uint64_t begin = localAt + 30 + littleEndian16(data + localAt + 26) + littleEndian16(data + localAt + 28);
    if (begin > size || compressed > size - begin)
      KOLO_THROW(FormatError, source, ": truncated .npz member (", compressed, " bytes declared)");
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    if (method == 0) {
      if (compressed != uncompressed) KOLO_THROW(FormatError, source, ": stored member with two sizes");
      arrays.emplace_back(name, parseNpy(file, data + begin, compressed, source));
    } else if (method == 8) {
      // Inflated into a buffer of the recorded size, never beyond it.
      auto bytes = std::make_shared<std::vector<uint8_t>>(std::max<uint64_t>(uncompressed, 1));
      z_stream stream{};
      if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) KOLO_THROW(IoError, "zlib init failed for ", source);
      stream.next_in = const_cast<Bytef*>(data + begin);
      stream.avail_in = static_cast<uInt>(compressed);
      stream.next_out = bytes->data();
      stream.avail_out = static_cast<uInt>(uncompressed);
      const int rc = inflate(&stream, Z_FINISH);
      const uint64_t produced = stream.total_out;
      inflateEnd(&stream);
      if (rc != Z_STREAM_END || produced != uncompressed)
        KOLO_THROW(FormatError, source, ": corrupt or truncated deflated .npz member (", produced, " of ",
                   uncompressed, " bytes)");
      const uint8_t* start = bytes->data();
      arrays.emplace_back(name, parseNpy(bytes, start, uncompressed, source));
    } else {
      KOLO_THROW(FormatError, source, ": zip compression method ", method, " is not supported (stored or deflate)");
    }
  }
  return arrays;
}

NpyDataset::NpyDataset(NpyArray inputs, NpyArray labels) : inputs_(std::move(inputs)), labels_(std::move(labels)) {
  if (inputs_.shape().empty())
    KOLO_THROW(FormatError, inputs_.source(), ": the inputs are a scalar; they need a first dimension of samples");
  if (labels_.shape().size() != 1)
    KOLO_THROW(FormatError, labels_.source(), ": the labels have shape ", shapeString(labels_.shape()),
               "; they must be one-dimensional [N]");
  if (inputs_.shape()[0] != labels_.shape()[0])
    KOLO_THROW(FormatError, inputs_.source(), " holds ", inputs_.shape()[0], " samples but ", labels_.source(),
               " holds ", labels_.shape()[0], " labels");
  const int64_t n = inputs_.shape()[0];
  rowElements_ = n > 0 ? inputs_.numel() / n : 0;
  labelValues_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = labels_.integerAt(i);
    if (label < 0) KOLO_THROW(FormatError, labels_.source(), ": label ", i, " is ", label, "; classes start at 0");
    labelValues_[static_cast<size_t>(i)] = label;
    classes_ = std::max(classes_, label + 1);
  }
}

int64_t NpyDataset::size() const { return static_cast<int64_t>(labelValues_.size()); }

Shape NpyDataset::sampleShape() const { return Shape(inputs_.shape().begin() + 1, inputs_.shape().end()); }

Batch NpyDataset::gather(const std::vector<int64_t>& indices) const {
  Shape shape = inputs_.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.inputs = Tensor::empty(shape, DType::F32);
  batch.labels = Tensor::empty({shape[0]}, DType::I64);
  batch.indices = indices;
  float* x = batch.inputs.data<float>();
  int64_t* y = batch.labels.data<int64_t>();
  const int64_t n = size();
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t index = indices[i];
    KOLO_REQUIRE(index >= 0 && index < n, inputs_.source(), ": sample index ", index, " out of range [0, ", n, ")");
    inputs_.copyF32(index * rowElements_, rowElements_, x + static_cast<int64_t>(i) * rowElements_);
    y[i] = labelValues_[static_cast<size_t>(index)];
  }
  return batch;
}

std::shared_ptr<NpyDataset> loadNpyDataset(const std::string& inputsPath, const std::string& labelsPath) {
  if (!labelsPath.empty()) return std::make_shared<NpyDataset>(loadNpy(inputsPath), loadNpy(labelsPath));
  auto arrays = loadNpz(inputsPath);
  auto find = [&arrays](const std::string& name) -> const NpyArray* {
    for (const auto& entry : arrays)
      if (entry.first == name) return &entry.second;
    return nullptr;
  };
  static const char* kPairs[][2] = {{"x", "y"}, {"X", "y"}, {"inputs", "labels"}, {"images", "labels"}, {"data", "labels"}};
  for (const auto& pair : kPairs) {
    const NpyArray* x = find(pair[0]);
    const NpyArray* y = find(pair[1]);
    if (x && y) return std::make_shared<NpyDataset>(*x, *y);
  }
  std::string names;
  for (const auto& entry : arrays) names += (names.empty() ? "" : ", ") + entry.first;
  KOLO_THROW(FormatError, inputsPath, ": the archive holds the arrays [", names,
             "]; name the inputs and labels x and y (or inputs/images/data and labels)");
}

}  // namespace kolo::data
