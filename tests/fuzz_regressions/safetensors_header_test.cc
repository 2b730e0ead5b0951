// The safetensors header checks, fed the fuzzer's seeds and the inputs that once broke them
// through loadSafetensors (so every accepted file is also allocated and read), and
// hand-made headers with huge, negative or overflowing shapes and offsets past the end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz_regressions/fuzz_inputs.h"
#include "kolo/safetensors.h"

namespace kolo::fuzz_regressions {
namespace {

namespace fs = std::filesystem;

checkpoint::SafetensorsFile load(const std::vector<uint8_t>& b) {
  const fs::path path = fs::temp_directory_path() / ("kolo_st_fuzz_" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                             static_cast<std::streamsize>(b.size()));
  struct Remove {
    fs::path path;
    ~Remove() { fs::remove(path); }
  } remove{path};
  return checkpoint::loadSafetensors(path.string());
}

std::vector<uint8_t> file(const std::string& header, size_t dataBytes) {
  std::vector<uint8_t> b;
  b.reserve(8 + header.size() + dataBytes);
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(uint64_t(header.size()) >> (8 * i)));
  for (char c : header) b.push_back(static_cast<uint8_t>(c));
  b.resize(b.size() + dataBytes, 0);
  return b;
}

std::string errorOf(const std::string& header, size_t dataBytes) {
  return formatErrorOf([&] { load(file(header, dataBytes)); });
}

TEST(SafetensorsHeaderTest, SeedsLoadAndRegressionsThrow) {
  const auto seeds = seedInputs("safetensors");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, load), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("safetensors"), load);
}

TEST(SafetensorsHeaderTest, ShapesThatOverflowOrAreNegativeThrow) {
  // A zero dimension made the element count 0, and 2^63 then became a negative int64.
  EXPECT_NE(errorOf(R"({"a":{"dtype":"F32","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", 0)
                .find("too large"),
            std::string::npos);
  EXPECT_NE(errorOf(R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0)
                .find("too large"),
            std::string::npos);
  EXPECT_NE(errorOf(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4).find("bad dimension"),
            std::string::npos);
  EXPECT_NE(errorOf(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4).find("bad dimension"),
            std::string::npos);
  errorOf(R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8);
}

TEST(SafetensorsHeaderTest, OffsetsAndLengthsPastTheEndThrow) {
  errorOf(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3);
  errorOf(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551612,0]}})", 4);
  errorOf(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3);
  EXPECT_NE(formatErrorOf([] {
              std::vector<uint8_t> b(8, 0xff);
              load(b);
            }).find("header length"),
            std::string::npos);
  formatErrorOf([] { load({1, 2, 3}); });
  formatErrorOf([] { load(file("{", 0)); });
  formatErrorOf([] { load(file("[]", 0)); });
  formatErrorOf([] { load(file(R"({"__metadata__":{"k":1}})", 0)); });
}

TEST(SafetensorsHeaderTest, DeepNestingThrowsInsteadOfOverflowingTheStack) {
  const std::string deep = R"({"a":{"dtype":)" + std::string(200000, '[') + std::string(200000, ']') + "}}";
  EXPECT_NE(errorOf(deep, 0).find("nests deeper"), std::string::npos);
}

TEST(SafetensorsHeaderTest, EmptyTensorBesideTheNextOneAtTheSameOffsetLoads) {
  // Sorting by start offset alone could put [8, 16) before the empty [8, 8).
  for (int repeat = 0; repeat < 8; ++repeat) {
    const auto loaded = load(file(
        R"({"z":{"dtype":"U8","shape":[8],"data_offsets":[8,16]},)"
        R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
        R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
        16));
    EXPECT_EQ(loaded.tensors.size(), 3u);
  }
}

}  // namespace
}  // namespace kolo::fuzz_regressions
