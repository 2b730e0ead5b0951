// Reading IDX files (the MNIST family's format), raw or gzip-compressed, with errors that
// name the file and what is wrong with it.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "kolo/data.h"

namespace kolo::data {
namespace {

// Larger element counts are refused as implausible (and keep every product of dimensions
// far from overflowing int64).
constexpr uint64_t kMaxIdxElements = uint64_t(1) << 40;

/// A file's bytes, read whole into an uninitialised buffer (tens of MB for a data set: no
/// zero-filling first).
struct FileBytes {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0;
};

FileBytes readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) KOLO_THROW(IoError, "cannot open ", path, ": ", std::strerror(errno));
  FileBytes bytes;
  bytes.size = static_cast<size_t>(in.tellg());
  bytes.data.reset(new uint8_t[std::max<size_t>(bytes.size, 1)]);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data.get()), std::streamsize(bytes.size)))
    KOLO_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
  return bytes;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string dimsText(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

/// The header of an IDX file: its dimensions and the bytes the header itself takes.
struct IdxHeader {
  std::vector<int64_t> dims;
  size_t headerBytes = 0;
  uint64_t count = 0;  // elements, one byte each
};

/// Parses the header at the start of `bytes`; std::nullopt when fewer bytes than the header
/// needs are there (`complete`: that is an error rather than "read more").
std::optional<IdxHeader> parseIdxHeader(const uint8_t* bytes, size_t size, bool complete,
                                        const std::string& source) {
  if (size < 4) {
    if (!complete) return std::nullopt;
    KOLO_THROW(FormatError, source, ": truncated IDX file (", size, " bytes, no header)");
  }
  // Magic: two zero bytes, the element type code, the number of dimensions.
  if (bytes[0] != 0 || bytes[1] != 0) {
    KOLO_THROW(FormatError, source, ": bad IDX magic 0x", std::hex, bigEndian32(bytes),
               " (expected 0x0000TTDD: zero bytes, type code, dimension count)");
  }
  const int typeCode = bytes[2];
  const int ndim = bytes[3];
  if (typeCode != 0x08) {
    KOLO_THROW(FormatError, source, ": IDX element type 0x", std::hex, typeCode,
               " is not supported (only unsigned byte, 0x08)");
  }
  if (ndim == 0) KOLO_THROW(FormatError, source, ": IDX header declares 0 dimensions");
  IdxHeader header;
  header.headerBytes = 4 + 4 * size_t(ndim);
  if (size < header.headerBytes) {
    if (!complete) return std::nullopt;
    KOLO_THROW(FormatError, source, ": truncated IDX header (", size, " bytes, ", ndim,
               " dimensions need ", header.headerBytes, ")");
  }
  // A zero dimension empties the array, but the others are still used as sizes and
  // strides: the product of the non-zero dimensions is bounded too.
  uint64_t count = 1;
  uint64_t nonzero = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint32_t dim = bigEndian32(bytes + 4 + 4 * d);
    header.dims.push_back(dim);
    if (dim != 0 && (nonzero > kMaxIdxElements / dim))
      KOLO_THROW(FormatError, source, ": IDX dimensions ", dimsText(header.dims),
                 "... are implausibly large");
    if (dim != 0) nonzero *= dim;
    count = dim == 0 ? 0 : count * dim;
  }
  header.count = count;
  return header;
}

/// How many bytes of an IDX file to keep: the header and the first `maxItems` items (all
/// of them when `maxItems` is 0 or at least the declared count).
uint64_t keptBytes(const IdxHeader& header, int64_t maxItems) {
  const uint64_t items = uint64_t(header.dims[0]);
  if (maxItems <= 0 || uint64_t(maxItems) >= items) return header.headerBytes + header.count;
  return header.headerBytes + header.count / items * uint64_t(maxItems);
}

// Inflates a gzip stream (possibly several concatenated members) as far as `maxItems`
// items need, or whole, stopping with FormatError once the output passes what the IDX
// header at its start declares: a small compressed file cannot make the reader allocate
// more than the header claims. Reading stops early only with a limit, so the gzip trailer
// of a whole read is always checked.
std::vector<uint8_t> gunzipIdx(const uint8_t* compressed, size_t size, int64_t maxItems,
                               const std::string& source) {
  // Enough for any header; the buffer takes its final size once the header is read.
  std::vector<uint8_t> out(1 << 16);
  z_stream stream{};
  // 16 + MAX_WBITS: expect a gzip header and trailer.
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    KOLO_THROW(IoError, "zlib init failed for ", source);
  stream.next_in = const_cast<Bytef*>(compressed);
  stream.avail_in = static_cast<uInt>(size);
  size_t produced = 0;
  std::optional<uint64_t> declared;  // header + data bytes, once the header is inflated
  std::optional<uint64_t> wanted;    // what the limit keeps of them
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    stream.next_out = out.data() + produced;
    stream.avail_out = static_cast<uInt>(out.size() - produced);
    const int rc = inflate(&stream, Z_NO_FLUSH);
    produced = out.size() - stream.avail_out;
    if (!declared) {
      try {
        if (auto header = parseIdxHeader(out.data(), produced, false, source)) {
          declared = header->headerBytes + header->count;
          wanted = keptBytes(*header, maxItems);
          // One buffer of the final size (a byte over, to see data past the declared end)
          // instead of doubling and copying towards it; never more than deflate can expand
          // `size` bytes to (1032:1), whatever a header claims.
          const uint64_t room = std::min<uint64_t>(*wanted < *declared ? *wanted : *declared + 1,
                                                   uint64_t(size) * 1032 + (1 << 16));
          if (room > out.size()) out.resize(room);
        }
      } catch (...) {
        inflateEnd(&stream);
        throw;
      }
    }
    if (declared && produced > *declared) {
      inflateEnd(&stream);
      KOLO_THROW(FormatError, source, ": IDX size mismatch: the gzip data holds more than the ",
                 *declared, " bytes its header declares");
    }
    if (wanted && *wanted < *declared && produced >= *wanted) {
      produced = *wanted;
      break;
    }
    if (rc == Z_STREAM_END) {
      if (stream.avail_in == 0) break;
      inflateReset(&stream);  // another gzip member follows
      continue;
    }
    if (rc == Z_BUF_ERROR && stream.avail_in == 0) {
      inflateEnd(&stream);
      KOLO_THROW(FormatError, source, ": truncated gzip stream (", size,
                 " compressed bytes end before the gzip trailer)");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      std::string msg = stream.msg ? stream.msg : "unknown error";
      inflateEnd(&stream);
      KOLO_THROW(FormatError, source, ": corrupt gzip data (", msg, ")");
    }
  }
  inflateEnd(&stream);
  out.resize(produced);
  return out;
}

/// Checks the IDX bytes `data` and keeps their first `maxItems` items; `owned`, when given,
/// holds those same bytes and is moved into the result instead of copied.
IdxArray parseRawIdx(const uint8_t* data, size_t size, int64_t maxItems,
                     const std::string& source, std::vector<uint8_t>* owned = nullptr) {
  const IdxHeader header = *parseIdxHeader(data, size, true, source);
  const uint64_t payload = size - header.headerBytes;
  const uint64_t kept = keptBytes(header, maxItems);
  // By items, not bytes: a zero among the other dimensions makes every item empty.
  const bool limited = maxItems > 0 && maxItems < header.dims[0];
  if (payload < header.count && !(limited && size >= kept)) {
    KOLO_THROW(FormatError, source, ": truncated IDX data: dimensions ", dimsText(header.dims),
               " need ", header.count, " bytes, file holds ", payload);
  }
  if (payload > header.count) {
    KOLO_THROW(FormatError, source, ": IDX size mismatch: dimensions ", dimsText(header.dims),
               " need ", header.count, " bytes, file holds ", payload, " (",
               payload - header.count, " extra)");
  }
  IdxArray array;
  array.dims = header.dims;
  array.fileItems = header.dims[0];
  if (limited) array.dims[0] = maxItems;
  if (owned) {
    owned->resize(kept);
    owned->erase(owned->begin(), owned->begin() + std::ptrdiff_t(header.headerBytes));
    array.values = std::move(*owned);
  } else {
    array.values.assign(data + header.headerBytes, data + kept);
  }
  return array;
}

}  // namespace

IdxArray parseIdx(const uint8_t* data, size_t size, const std::string& source,
                  int64_t maxItems) {
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    std::vector<uint8_t> raw = gunzipIdx(data, size, maxItems, source);
    return parseRawIdx(raw.data(), raw.size(), maxItems, source, &raw);
  }
  return parseRawIdx(data, size, maxItems, source);
}

IdxArray readIdx(const std::string& path, int64_t maxItems) {
  const FileBytes bytes = readWholeFile(path);
  return parseIdx(bytes.data.get(), bytes.size, path, maxItems);
}

}  // namespace kolo::data
