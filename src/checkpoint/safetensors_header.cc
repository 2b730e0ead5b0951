// Parsing and checking of safetensors headers. Header bytes come from untrusted files:
// every length, dimension and offset is checked before anything is allocated or copied.
#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "checkpoint/bounded_json.h"
#include "kolo/error.h"

namespace kolo::checkpoint::detail {
namespace {

// Element counts are capped so that any tensor's size in bytes, and its strides, fit in int64.
constexpr uint64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;

bool parseDtypeName(const std::string& name, DType& out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8}};
  for (const auto& [text, dtype] : kTable) {
    if (name == text) {
      out = dtype;
      return true;
    }
  }
  return false;
}

std::string dimsText(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

SafetensorsEntry parseEntry(const std::string& name, const nlohmann::json& value,
                            uint64_t dataBytes, const std::string& source) {
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
      !value.contains("data_offsets")) {
    KOLO_THROW(FormatError, source, ": entry ", name, " lacks dtype, shape or data_offsets");
  }
  SafetensorsEntry entry;
  entry.name = name;
  const auto& dtype = value["dtype"];
  if (!dtype.is_string() || !parseDtypeName(dtype.get<std::string>(), entry.dtype))
    KOLO_THROW(FormatError, source, ": entry ", name, " has unsupported dtype ", dtype.dump());
  const auto& shape = value["shape"];
  if (!shape.is_array())
    KOLO_THROW(FormatError, source, ": entry ", name, " has a shape that is not a list");
  // A zero dimension makes the tensor empty, but the other dimensions still size its
  // strides: their product is bounded as well.
  uint64_t numel = 1;
  uint64_t nonzero = 1;
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned())
      KOLO_THROW(FormatError, source, ": entry ", name, " has a bad dimension ", dim.dump());
    const uint64_t d = dim.get<uint64_t>();
    if (d != 0 && (__builtin_mul_overflow(nonzero, d, &nonzero) || nonzero > kMaxElements))
      KOLO_THROW(FormatError, source, ": entry ", name, " shape is too large");
    numel = d == 0 ? 0 : numel * d;
    entry.shape.push_back(static_cast<int64_t>(d));
  }
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    KOLO_THROW(FormatError, source, ": entry ", name, " has bad data_offsets ", offsets.dump());
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > dataBytes) {
    KOLO_THROW(FormatError, source, ": entry ", name, " data_offsets [", entry.begin, ", ",
               entry.end, "] lie outside the ", dataBytes, " data bytes (file truncated?)");
  }
  const uint64_t bytes = numel * dtypeSize(entry.dtype);
  if (entry.end - entry.begin != bytes) {
    KOLO_THROW(FormatError, source, ": entry ", name, " has ", entry.end - entry.begin,
               " bytes but shape ", dimsText(entry.shape), " of ",
               safetensorsDtypeName(entry.dtype), " needs ", bytes);
  }
  return entry;
}

}  // namespace

const char* safetensorsDtypeName(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

uint64_t parseSafetensorsHeaderLength(const uint8_t* first8, uint64_t fileSize,
                                      const std::string& source) {
  if (fileSize < 8)
    KOLO_THROW(FormatError, source, ": truncated safetensors file (", fileSize,
               " bytes, no header length)");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(first8[i]) << (8 * i);
  if (length > kMaxSafetensorsHeaderBytes || length > fileSize - 8) {
    KOLO_THROW(FormatError, source, ": bad safetensors header length ", length, " (file has ",
               fileSize, " bytes)");
  }
  return length;
}

SafetensorsLayout parseSafetensorsHeader(std::string_view json, uint64_t dataBytes,
                                         const std::string& source) {
  const nlohmann::json header = parseBoundedJson(json, source + ": safetensors header");
  if (!header.is_object())
    KOLO_THROW(FormatError, source, ": safetensors header is not a JSON object");
  SafetensorsLayout layout;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) KOLO_THROW(FormatError, source, ": __metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string())
          KOLO_THROW(FormatError, source, ": __metadata__ value of ", key, " is not a string");
        layout.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    layout.entries.push_back(parseEntry(name, value, dataBytes, source));
  }
  auto& entries = layout.entries;
  // Empty tensors share their offset with the next one: order by end too, so they come first.
  std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The data section must be covered exactly, without holes or overlaps.
  uint64_t expected = 0;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.begin != expected) {
      KOLO_THROW(FormatError, source, ": entry ", entry.name, " starts at byte ", entry.begin,
                 ", expected ", expected, " (overlapping or non-contiguous data_offsets)");
    }
    expected = entry.end;
  }
  if (expected != dataBytes) {
    KOLO_THROW(FormatError, source, ": header describes ", expected,
               " data bytes but the file holds ", dataBytes);
  }
  return layout;
}

}  // namespace kolo::checkpoint::detail
