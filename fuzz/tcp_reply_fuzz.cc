// TCP store reply bodies as the client parses them. The first byte picks the request the
// reply answers (its opcode), the rest is the reply body.
#include <cstddef>
#include <cstdint>

#include "comm/store/tcp_wire.h"
#include "fuzz_check.h"
#include "kolo/comm/stores.h"

using namespace kolo::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto op = static_cast<detail::StoreOp>(data[0] % 14);
  try {
    const detail::StoreReply reply = detail::parseStoreReply(op, data + 1, size - 1);
    KOLO_FUZZ_REQUIRE(reply.status == detail::StoreStatus::Ok ||
                      reply.status == detail::StoreStatus::Timeout ||
                      reply.status == detail::StoreStatus::Error);
    KOLO_FUZZ_REQUIRE(reply.value.size() < size && reply.message.size() < size);
    KOLO_FUZZ_REQUIRE(reply.missing.size() <= size / 4);
    KOLO_FUZZ_REQUIRE(reply.present.size() < size);
    if (reply.status == detail::StoreStatus::Timeout) KOLO_FUZZ_REQUIRE(detail::storeOpWaits(op));
    // A get-available answer: one presence flag and one value (empty when absent) per key,
    // each at least its flag's byte; a multi-get's values each at least their 4-byte length.
    if (op == detail::StoreOp::GetAvailable)
      KOLO_FUZZ_REQUIRE(reply.present.size() == reply.values.size() && reply.values.size() < size);
    else
      KOLO_FUZZ_REQUIRE(reply.values.size() <= size / 4);
    for (const auto& key : reply.missing) KOLO_FUZZ_REQUIRE(key.size() <= kMaxStoreKeyBytes);
  } catch (const kolo::Error&) {
  }
  return 0;
}
