// Native-transport frame headers as the progress engine receives them from a peer; a
// header that passes the check is described the way Mismatch messages describe it.
#include <cstddef>
#include <cstdint>

#include "comm/native/frame.h"
#include "fuzz_check.h"
#include "kolo/error.h"

using namespace kolo::comm::native;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const FrameHeader header = parseFrameHeader(data, size);
    KOLO_FUZZ_REQUIRE(header.magic == kFrameMagic && header.length <= kMaxFrameBytes);
    const Signature signature = header.signature();
    KOLO_FUZZ_REQUIRE(!describeSignature(signature).empty());
    KOLO_FUZZ_REQUIRE(collectiveName(signature.collective)[0] != 'u');  // not "unknown"
    KOLO_FUZZ_REQUIRE(kolo::dtypeSize(signature.dtype) > 0);
  } catch (const kolo::Error&) {
  }
  return 0;
}
