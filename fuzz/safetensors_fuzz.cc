// Safetensors files: the input is a whole file (8-byte header length, JSON header, data).
// A header that passes must describe tensors the loader can allocate and fill: shapes
// whose strides fit in int64, byte ranges inside the data that match the shapes.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "checkpoint/safetensors_header.h"
#include "fuzz_check.h"
#include "kolo/error.h"

using namespace kolo::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const uint64_t headerBytes = detail::parseSafetensorsHeaderLength(data, size, "fuzz");
    const uint64_t dataBytes = size - 8 - headerBytes;
    const detail::SafetensorsLayout layout = detail::parseSafetensorsHeader(
        std::string_view(reinterpret_cast<const char*>(data) + 8, headerBytes), dataBytes, "fuzz");
    uint64_t expected = 0;
    for (const auto& entry : layout.entries) {
      KOLO_FUZZ_REQUIRE(entry.begin == expected && entry.begin <= entry.end);
      expected = entry.end;
      int64_t stride = 1;
      int64_t numel = 1;
      for (auto it = entry.shape.rbegin(); it != entry.shape.rend(); ++it) {
        KOLO_FUZZ_REQUIRE(*it >= 0);
        KOLO_FUZZ_REQUIRE(!__builtin_mul_overflow(stride, *it == 0 ? 1 : *it, &stride));
        numel *= *it;
      }
      KOLO_FUZZ_REQUIRE(!__builtin_mul_overflow(stride, 8, &stride));
      KOLO_FUZZ_REQUIRE(uint64_t(numel) * kolo::dtypeSize(entry.dtype) == entry.end - entry.begin);
    }
    KOLO_FUZZ_REQUIRE(expected == dataBytes);
  } catch (const kolo::Error&) {
  }
  return 0;
}
