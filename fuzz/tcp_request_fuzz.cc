// TCP store request bodies as the server parses them, once as the first request of a
// connection (only Hello is allowed) and once after it.
#include <cstddef>
#include <cstdint>

#include "comm/store/tcp_wire.h"
#include "fuzz_check.h"
#include "kolo/comm/stores.h"

using namespace kolo::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (bool authenticated : {false, true}) {
    try {
      const detail::StoreRequest request = detail::parseStoreRequest(
          data, size, authenticated, kMaxStoreKeyBytes, kMaxStoreValueBytes);
      KOLO_FUZZ_REQUIRE((request.op == detail::StoreOp::Hello) != authenticated);
      KOLO_FUZZ_REQUIRE(request.token.size() <= size);
      KOLO_FUZZ_REQUIRE(request.value.size() + request.expected.size() <= size);
      KOLO_FUZZ_REQUIRE(request.values.empty() || request.values.size() == request.keys.size());
      size_t keyBytes = 0;
      for (const auto& key : request.keys) {
        KOLO_FUZZ_REQUIRE(!key.empty() && key.size() <= kMaxStoreKeyBytes);
        keyBytes += 4 + key.size();
      }
      KOLO_FUZZ_REQUIRE(keyBytes <= size);
      // A barrier request counts at least one arrival and never more than an int32 holds.
      KOLO_FUZZ_REQUIRE(request.arrivals >= 1 && request.arrivals <= INT32_MAX);
    } catch (const kolo::Error&) {
    }
  }
  return 0;
}
