// Checkpoint manifests (meta.json). Even first byte: the rest is the file as it is. Odd:
// the rest, if it is a JSON object, gets a correct manifest_crc32 first, so mutations reach
// the field checks behind the checksum.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "checkpoint/bounded_json.h"
#include "checkpoint/manifest.h"
#include "fuzz_check.h"
#include "kolo/error.h"

using namespace kolo::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] & 1) {
      nlohmann::json manifest = detail::parseBoundedJson(text, "fuzz");
      if (!manifest.is_object()) return 0;
      manifest["manifest_crc32"] = detail::manifestCrc(manifest);
      text = manifest.dump();
    }
    const detail::Manifest parsed = detail::parseManifest(text, "fuzz", "model.safetensors");
    KOLO_FUZZ_REQUIRE(parsed.state.step >= 0);
    KOLO_FUZZ_REQUIRE(parsed.files.count("model.safetensors") == 1);
    for (const auto& [name, file] : parsed.files)
      KOLO_FUZZ_REQUIRE(name.find('/') == std::string::npos && name != ".." && name != ".");
  } catch (const kolo::Error&) {
  }
  return 0;
}
