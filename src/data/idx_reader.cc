// Reading IDX files (the MNIST family's format), raw or gzip-compressed, with errors that
// name the file and what is wrong with it.
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "kolo/data.h"

namespace kolo::data {
namespace {

std::vector<uint8_t> readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) KOLO_THROW(IoError, "cannot open ", path, ": ", std::strerror(errno));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Inflates a whole gzip stream (possibly several concatenated members).
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& path) {
  std::vector<uint8_t> out;
  out.resize(std::max<size_t>(compressed.size() * 4, 1 << 16));
  z_stream stream{};
  // 16 + MAX_WBITS: expect a gzip header and trailer.
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    KOLO_THROW(IoError, "zlib init failed for ", path);
  stream.next_in = const_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());
  size_t produced = 0;
  int rc = Z_OK;
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    stream.next_out = out.data() + produced;
    stream.avail_out = static_cast<uInt>(out.size() - produced);
    rc = inflate(&stream, Z_NO_FLUSH);
    produced = out.size() - stream.avail_out;
    if (rc == Z_STREAM_END) {
      if (stream.avail_in == 0) break;
      inflateReset(&stream);  // another gzip member follows
      continue;
    }
    if (rc == Z_BUF_ERROR && stream.avail_in == 0) {
      inflateEnd(&stream);
      KOLO_THROW(FormatError, path, ": truncated gzip stream (", compressed.size(),
                 " compressed bytes end before the gzip trailer)");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      std::string msg = stream.msg ? stream.msg : "unknown error";
      inflateEnd(&stream);
      KOLO_THROW(FormatError, path, ": corrupt gzip data (", msg, ")");
    }
  }
  inflateEnd(&stream);
  out.resize(produced);
  return out;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

IdxArray readIdx(const std::string& path) {
  std::vector<uint8_t> bytes = readWholeFile(path);
  if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) bytes = gunzip(bytes, path);
  if (bytes.size() < 4)
    KOLO_THROW(FormatError, path, ": truncated IDX file (", bytes.size(), " bytes, no header)");
  // Magic: two zero bytes, the element type code, the number of dimensions.
  if (bytes[0] != 0 || bytes[1] != 0) {
    KOLO_THROW(FormatError, path, ": bad IDX magic 0x", std::hex, bigEndian32(bytes.data()),
               " (expected 0x0000TTDD: zero bytes, type code, dimension count)");
  }
  const int typeCode = bytes[2];
  const int ndim = bytes[3];
  if (typeCode != 0x08) {
    KOLO_THROW(FormatError, path, ": IDX element type 0x", std::hex, typeCode,
               " is not supported (only unsigned byte, 0x08)");
  }
  if (ndim == 0) KOLO_THROW(FormatError, path, ": IDX header declares 0 dimensions");
  const size_t headerBytes = 4 + 4 * size_t(ndim);
  if (bytes.size() < headerBytes) {
    KOLO_THROW(FormatError, path, ": truncated IDX header (", bytes.size(), " bytes, ", ndim,
               " dimensions need ", headerBytes, ")");
  }
  IdxArray array;
  uint64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    const uint32_t dim = bigEndian32(bytes.data() + 4 + 4 * d);
    array.dims.push_back(dim);
    count *= dim;
    if (count > (uint64_t(1) << 40))
      KOLO_THROW(FormatError, path, ": IDX dimensions are implausibly large");
  }
  const uint64_t payload = bytes.size() - headerBytes;
  if (payload < count) {
    KOLO_THROW(FormatError, path, ": truncated IDX data: dimensions ", shapeString(array.dims),
               " need ", count, " bytes, file holds ", payload);
  }
  if (payload > count) {
    KOLO_THROW(FormatError, path, ": IDX size mismatch: dimensions ", shapeString(array.dims),
               " need ", count, " bytes, file holds ", payload, " (", payload - count, " extra)");
  }
  array.values.assign(bytes.begin() + headerBytes, bytes.end());
  return array;
}

}  // namespace kolo::data
