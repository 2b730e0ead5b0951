// Counter values as the stores' `add` reads them from a key's bytes (a file of the file
// store, a value any client may have set on the TCP or memory store). The first 8 bytes
// are the delta, the rest the stored value.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "comm/store/store_detail.h"
#include "fuzz_check.h"
#include "kolo/error.h"

using namespace kolo::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  int64_t delta = 0;
  std::memcpy(&delta, data, 8);
  const Bytes value(data + 8, data + size);
  try {
    const int64_t sum = detail::addToCounter("fuzz", &value, delta);
    const int64_t stored = detail::parseCounter("fuzz", value);
    KOLO_FUZZ_REQUIRE(sum - delta == stored);
    KOLO_FUZZ_REQUIRE(detail::parseCounter("fuzz", detail::encodeCounter(sum)) == sum);
  } catch (const kolo::Error&) {
  }
  return 0;
}
