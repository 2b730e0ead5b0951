// The safetensors header parsed from bytes, apart from file I/O: the 8-byte length and the
// JSON that maps names to dtype, shape and data_offsets. loadSafetensors reads files
// through it; tests and the fuzzer feed it bytes directly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/dtype.h"

namespace kolo::checkpoint::detail {

/// Header lengths beyond this are refused (the format's reference reader uses 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

/// One tensor's place in the data section, [begin, end) relative to its start.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// A checked header: entries ordered by `begin`, covering the data section exactly.
struct SafetensorsLayout {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

/// "F32", "BF16", ... as safetensors spells kolo's dtypes.
const char* safetensorsDtypeName(DType dtype);

/// The JSON header's length from the file's first 8 bytes (little-endian). Throws
/// FormatError naming `source` when it exceeds kMaxSafetensorsHeaderBytes or the
/// `fileSize - 8` bytes that follow.
uint64_t parseSafetensorsHeaderLength(const uint8_t* first8, uint64_t fileSize,
                                      const std::string& source);

/// Checks the JSON header against a data section of `dataBytes`: every entry has a known
/// dtype, a shape of non-negative dimensions whose element count fits in int64 bytes, and
/// data_offsets that match the shape, lie inside the data and cover it without gaps or
/// overlaps. Throws FormatError naming `source` and the entry otherwise.
SafetensorsLayout parseSafetensorsHeader(std::string_view json, uint64_t dataBytes,
                                         const std::string& source);

}  // namespace kolo::checkpoint::detail
