// IDX files, raw or gzip-compressed. An array that parses holds exactly the elements its
// dimensions multiply to; read again with a limit of items, it gives the first of them.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fuzz_check.h"
#include "kolo/data.h"

namespace {

void checkShape(const kolo::data::IdxArray& array) {
  KOLO_FUZZ_REQUIRE(!array.dims.empty());
  uint64_t count = 1;
  for (int64_t dim : array.dims) {
    KOLO_FUZZ_REQUIRE(dim >= 0);
    KOLO_FUZZ_REQUIRE(!__builtin_mul_overflow(count, uint64_t(dim), &count));
  }
  KOLO_FUZZ_REQUIRE(count == array.values.size());
  KOLO_FUZZ_REQUIRE(array.fileItems >= array.dims[0]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The limit comes from the input's length, so every input is also read as a prefix.
  const int64_t limit = int64_t(size % 4) + 1;
  bool whole = false;
  kolo::data::IdxArray all;
  try {
    all = kolo::data::parseIdx(data, size, "fuzz");
    checkShape(all);
    KOLO_FUZZ_REQUIRE(all.fileItems == all.dims[0]);
    whole = true;
  } catch (const kolo::Error&) {
  }
  try {
    const kolo::data::IdxArray first = kolo::data::parseIdx(data, size, "fuzz", limit);
    checkShape(first);
    KOLO_FUZZ_REQUIRE(first.dims[0] <= limit);
    if (whole) {
      // A file that reads whole reads as its own prefix.
      KOLO_FUZZ_REQUIRE(first.dims[0] == std::min(limit, all.dims[0]));
      KOLO_FUZZ_REQUIRE(std::equal(first.values.begin(), first.values.end(), all.values.begin()));
    }
  } catch (const kolo::Error&) {
    KOLO_FUZZ_REQUIRE(!whole);  // what reads whole also reads in part
  }
  return 0;
}
