// PNG and JPEG images through libpng and libjpeg-turbo. An image that decodes holds exactly
// channels x height x width bytes; a corrupt one is a kolo::Error, never an exit or a crash.
#include <cstddef>
#include <cstdint>

#include "fuzz_check.h"
#include "kolo/image_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const int64_t channels : {0, 1, 3}) {
    try {
      const kolo::data::DecodedImage image = kolo::data::decodeImage(data, size, channels, "fuzz");
      KOLO_FUZZ_REQUIRE(image.channels == 1 || image.channels == 3);
      KOLO_FUZZ_REQUIRE(channels == 0 || image.channels == channels);
      KOLO_FUZZ_REQUIRE(image.pixels.size() == size_t(image.channels * image.height * image.width));
    } catch (const kolo::Error&) {
    }
  }
  return 0;
}
