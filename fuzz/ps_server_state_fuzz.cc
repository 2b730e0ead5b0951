// A parameter server's checkpoint file (server-<i>.safetensors) as --resume reads it: the
// safetensors header, then the metadata check of server_state_metadata.cc for server 0
// running Adam. Facts that pass are counts.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "checkpoint/safetensors_header.h"
#include "fuzz_check.h"
#include "kolo/error.h"
#include "parallel/ps/server_state.h"

using namespace kolo;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  try {
    const uint64_t length = checkpoint::detail::parseSafetensorsHeaderLength(data, size, "fuzz");
    const std::string_view json(reinterpret_cast<const char*>(data) + 8, length);
    const auto layout = checkpoint::detail::parseSafetensorsHeader(json, size - 8 - length, "fuzz");
    const auto facts =
        parallel::ps::detail::checkServerStateMetadata(layout.metadata, "fuzz", 0, "adam");
    KOLO_FUZZ_REQUIRE(facts.version >= 0 && facts.step >= 0);
    KOLO_FUZZ_REQUIRE(layout.metadata.at("server") == "0" && layout.metadata.at("optimizer") == "adam");
  } catch (const Error&) {
  }
  return 0;
}
