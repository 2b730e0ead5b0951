// Reading IDX files (the MNIST family's format), raw or gzip-compressed, with errors that
// name the file and what is wrong with it.
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "kolo/data.h"

namespace kolo::data {
namespace {

// Larger element counts are refused as implausible (and keep every product of dimensions
// far from overflowing int64).
constexpr uint64_t kMaxIdxElements = uint64_t(1) << 40;

std::vector<uint8_t> readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) KOLO_THROW(IoError, "cannot open ", path, ": ", std::strerror(errno));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

// Inflates a whole gzip stream (possibly several concatenated members), stopping with
// FormatError once the output passes what the IDX header at its start declares: a small
// compressed file cannot make the reader allocate more than the header claims.
std::vector<uint8_t> gunzipIdx(const uint8_t* compressed, size_t size, const std::string& source) {
  std::vector<uint8_t> out;
  out.resize(std::min<size_t>(std::max<size_t>(size * 4, 1 << 16), 1 << 26));
  z_stream stream{};
  // 16 + MAX_WBITS: expect a gzip header and trailer.
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    KOLO_THROW(IoError, "zlib init failed for ", source);
  stream.next_in = const_cast<Bytef*>(compressed);
  stream.avail_in = static_cast<uInt>(size);
  size_t produced = 0;
  std::optional<uint64_t> declared;  // header + data bytes, once the header is inflated
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    stream.next_out = out.data() + produced;
    stream.avail_out = static_cast<uInt>(out.size() - produced);
    const int rc = inflate(&stream, Z_NO_FLUSH);
    produced = out.size() - stream.avail_out;
    if (!declared) {
      try {
        if (auto header = parseIdxHeader(out.data(), produced, false, source))
          declared = header->headerBytes + header->count;
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

IdxArray parseRawIdx(const uint8_t* data, size_t size, const std::string& source) {
  const IdxHeader header = *parseIdxHeader(data, size, true, source);
  const uint64_t payload = size - header.headerBytes;
  if (payload < header.count) {
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
  array.values.assign(data + header.headerBytes, data + size);
  return array;
}

}  // namespace

IdxArray parseIdx(const uint8_t* data, size_t size, const std::string& source) {
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    const std::vector<uint8_t> raw = gunzipIdx(data, size, source);
    return parseRawIdx(raw.data(), raw.size(), source);
  }
  return parseRawIdx(data, size, source);
}

IdxArray readIdx(const std::string& path) {
  const std::vector<uint8_t> bytes = readWholeFile(path);
  return parseIdx(bytes.data(), bytes.size(), path);
}

}  // namespace kolo::data
