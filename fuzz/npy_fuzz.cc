// NumPy .npy arrays and .npz archives. An array that parses has every element inside the
// bytes it came from (copyF32 over all of them runs under ASan); errors are kolo::Errors.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/npy_format.h"
#include "fuzz_check.h"

namespace {

void readAll(const kolo::data::NpyArray& array) {
  int64_t count = 1;
  for (const int64_t dim : array.shape()) count *= dim;
  KOLO_FUZZ_REQUIRE(count == array.numel());
  std::vector<float> out(size_t(std::min<int64_t>(array.numel(), 1 << 20)));
  array.copyF32(0, int64_t(out.size()), out.data());
  for (int64_t i = 0; i < std::min<int64_t>(array.numel(), 16); ++i) {
    try {
      array.integerAt(i);
    } catch (const kolo::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    readAll(kolo::data::parseNpy(nullptr, data, size, "fuzz.npy"));
  } catch (const kolo::Error&) {
  }
  try {
    for (const auto& entry : kolo::data::parseNpz(nullptr, data, size, "fuzz.npz")) readAll(entry.second);
  } catch (const kolo::Error&) {
  }
  return 0;
}
