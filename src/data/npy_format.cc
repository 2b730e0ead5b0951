// NumPy's formats: the .npy header parsed and checked against the bytes' length before any
// element is read, and .npz archives walked through their zip central directory (no file
// access and no tensors here: the fuzz harness drives these functions on raw bytes).
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/npy_format.h"
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

// One element of type T at `from`, which an .npz member may leave unaligned.
template <class T>
T elementAt(const uint8_t* from) {
  T value;
  std::memcpy(&value, from, sizeof(T));
  return value;
}

template <class T>
void convertElements(const uint8_t* from, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(elementAt<T>(from + i * int64_t(sizeof(T))));
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
  std::string shapeText = "[";
  for (size_t i = 0; i < array.shape_.size(); ++i) shapeText += (i ? ", " : "") + std::to_string(array.shape_[i]);
  shapeText += "]";
  const uint64_t payload = size - headerStart - headerLength;
  const uint64_t needed = count * uint64_t(elementBytes(array.type_));
  if (payload < needed)
    KOLO_THROW(FormatError, source, ": truncated .npy data: shape ", shapeText, " of ", descr, " needs ",
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
  if (count == 0) return;
  // Elements may be unaligned inside an .npz member: read them through memcpy.
  const uint8_t* from = elements_ + begin * elementBytes(type_);
  switch (type_) {
    case NpyType::F32: std::memcpy(out, from, size_t(count) * 4); break;
    case NpyType::F64: convertElements<double>(from, count, out); break;
    case NpyType::U8: convertElements<uint8_t>(from, count, out); break;
    case NpyType::I32: convertElements<int32_t>(from, count, out); break;
    case NpyType::I64: convertElements<int64_t>(from, count, out); break;
  }
}

void NpyArray::prefetch(int64_t begin, int64_t count) const {
  if (begin < 0 || count <= 0 || begin + count > numel_) return;
  const int size = elementBytes(type_);
  const uint8_t* from = elements_ + begin * size;
  for (int64_t at = 0; at < count * size; at += 64) __builtin_prefetch(from + at);
}

int64_t NpyArray::integerAt(int64_t index) const {
  KOLO_REQUIRE(index >= 0 && index < numel_, source_, ": element ", index, " is outside the array's ", numel_);
  const uint8_t* from = elements_ + index * elementBytes(type_);
  switch (type_) {
    case NpyType::U8: return *from;
    case NpyType::I32: return elementAt<int32_t>(from);
    case NpyType::I64: return elementAt<int64_t>(from);
    case NpyType::F32:
    case NpyType::F64: {
      const double v = type_ == NpyType::F32 ? elementAt<float>(from) : elementAt<double>(from);
      if (!(std::floor(v) == v && std::fabs(v) < 9.0e15))
        KOLO_THROW(FormatError, source_, ": element ", index, " is ", v, ", not a whole number (a class label)");
      return static_cast<int64_t>(v);
    }
  }
  return 0;
}

std::vector<std::pair<std::string, NpyArray>> parseNpz(std::shared_ptr<const void> file, const uint8_t* data,
                                                       size_t size, const std::string& path) {
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
      // Inflated into a buffer of the recorded size, never beyond it; and never larger than
      // deflate can expand the member's bytes (1032:1), whatever the directory claims.
      if (uncompressed > compressed * 1032 + 1024)
        KOLO_THROW(FormatError, source, ": deflated .npz member of ", compressed, " bytes claims ", uncompressed,
                   " bytes, more than deflate can expand it to");
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

}  // namespace kolo::data
