// The checkpoint manifest parser, fed the fuzzer's seeds, the inputs that once broke it,
// and manifests with a valid checksum but fields of the wrong type, range or place.
#include <gtest/gtest.h>

#include "checkpoint/manifest.h"
#include "fuzz_regressions/fuzz_inputs.h"

namespace kolo::fuzz_regressions {
namespace {

using nlohmann::json;

checkpoint::detail::Manifest parse(const std::string& text) {
  return checkpoint::detail::parseManifest(text, "test", "model.safetensors");
}

/// The harness's input format: a mode byte (odd: fix the checksum first), then the text.
void parseInput(const std::vector<uint8_t>& b) {
  if (b.empty()) throw FormatError("empty input");
  std::string text(b.begin() + 1, b.end());
  if (b[0] & 1) {
    json manifest = json::parse(text, nullptr, false);
    if (!manifest.is_object()) throw FormatError("not an object");
    manifest["manifest_crc32"] = checkpoint::detail::manifestCrc(manifest);
    text = manifest.dump();
  }
  parse(text);
}

json valid() {
  return {{"format", "kolo-checkpoint-1"},
          {"step", 3},
          {"epoch", 0},
          {"loader", {{"epoch", 0}, {"batch", 3}}},
          {"rng", {1, 2}},
          {"extra", {{"model", "mlp"}}},
          {"files", {{"model.safetensors", {{"bytes", 10}, {"crc32", 7}}}}}};
}

/// `manifest` with a correct checksum, as text.
std::string sealed(json manifest) {
  manifest["manifest_crc32"] = checkpoint::detail::manifestCrc(manifest);
  return manifest.dump();
}

TEST(ManifestTest, SeedsParseAndRegressionsThrow) {
  const auto seeds = seedInputs("manifest");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parseInput), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("manifest"), parseInput);
}

TEST(ManifestTest, ValidManifestParses) {
  const auto m = parse(sealed(valid()));
  EXPECT_EQ(m.state.step, 3);
  EXPECT_EQ(m.state.loader.batch, 3);
  EXPECT_EQ(m.state.rng, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(m.files.at("model.safetensors").crc32, 7u);
  EXPECT_FALSE(m.optimizer);
}

TEST(ManifestTest, FieldsOfTheWrongTypeOrRangeThrowFormatError) {
  auto errorWith = [](const char* pointer, json value) {
    json m = valid();
    m[json::json_pointer(pointer)] = std::move(value);
    return formatErrorOf([&] { parse(sealed(m)); });
  };
  // Each of these escaped as a JSON library exception or an out-of-range cast.
  errorWith("/step", 1e300);
  errorWith("/step", "3");
  errorWith("/step", -1);
  errorWith("/epoch", 9223372036854775808ull);
  errorWith("/loader", json::array());
  errorWith("/rng", json::array({-1}));
  errorWith("/extra/model", 5);
  errorWith("/files/model.safetensors/crc32", 4294967296ull);
  errorWith("/files/model.safetensors/bytes", "10");
  errorWith("/files/model.safetensors", 10);
  errorWith("/optimizer", json::object({{"kind", "sgd"}, {"scalars", {{"lr", "high"}}}}));
  errorWith("/optimizer", 1);
  EXPECT_NE(errorWith("/files/..", json::object({{"bytes", 1}, {"crc32", 1}})).find("outside"),
            std::string::npos);
  EXPECT_NE(errorWith("/files/a~1b", json::object({{"bytes", 1}, {"crc32", 1}})).find("outside"),
            std::string::npos);
  json noModel = valid();
  noModel["files"] = json::object();
  EXPECT_NE(formatErrorOf([&] { parse(sealed(noModel)); }).find("lists no"), std::string::npos);
}

TEST(ManifestTest, ChecksumAndFormatAreCheckedFirst) {
  json m = valid();
  m["manifest_crc32"] = "0";
  EXPECT_NE(formatErrorOf([&] { parse(m.dump()); }).find("checksum"), std::string::npos);
  m["manifest_crc32"] = 1e300;
  EXPECT_NE(formatErrorOf([&] { parse(m.dump()); }).find("checksum"), std::string::npos);
  m = valid();
  m["format"] = 1;
  EXPECT_NE(formatErrorOf([&] { parse(sealed(m)); }).find("not a kolo-checkpoint-1"), std::string::npos);
  formatErrorOf([] { parse(""); });
  formatErrorOf([] { parse("[]"); });
  EXPECT_NE(formatErrorOf([] { parse(std::string(100000, '[')); }).find("nests deeper"), std::string::npos);
}

}  // namespace
}  // namespace kolo::fuzz_regressions
