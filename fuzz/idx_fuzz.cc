// IDX files, raw or gzip-compressed. An array that parses holds exactly the elements its
// dimensions multiply to.
#include <cstddef>
#include <cstdint>

#include "fuzz_check.h"
#include "kolo/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kolo::data::IdxArray array = kolo::data::parseIdx(data, size, "fuzz");
    KOLO_FUZZ_REQUIRE(!array.dims.empty());
    uint64_t count = 1;
    for (int64_t dim : array.dims) {
      KOLO_FUZZ_REQUIRE(dim >= 0);
      KOLO_FUZZ_REQUIRE(!__builtin_mul_overflow(count, uint64_t(dim), &count));
    }
    KOLO_FUZZ_REQUIRE(count == array.values.size());
  } catch (const kolo::Error&) {
  }
  return 0;
}
