// The metadata check of a parameter server's checkpoint, fed the fuzzer's seeds and the
// files that once escaped as std::invalid_argument or std::out_of_range (std::stoll and
// std::stod on "three", a 20-digit version) or cast 1e999 to int64, and each refusal.
#include <gtest/gtest.h>

#include "checkpoint/safetensors_header.h"
#include "fuzz_regressions/fuzz_inputs.h"
#include "parallel/ps/server_state.h"

namespace kolo::fuzz_regressions {
namespace {

using parallel::ps::detail::checkServerStateMetadata;
using parallel::ps::detail::ServerStateFacts;

ServerStateFacts parse(const std::vector<uint8_t>& b) {
  if (b.size() < 8) throw FormatError("shorter than a length");
  const uint64_t length = checkpoint::detail::parseSafetensorsHeaderLength(b.data(), b.size(), "test");
  const std::string_view json(reinterpret_cast<const char*>(b.data()) + 8, length);
  const auto layout = checkpoint::detail::parseSafetensorsHeader(json, b.size() - 8 - length, "test");
  return checkServerStateMetadata(layout.metadata, "server-0.safetensors", 0, "adam");
}

TEST(PsServerStateTest, SeedsParseAndRegressionsThrowFormatError) {
  const auto seeds = seedInputs("ps_server_state");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parse), static_cast<int>(seeds.size()));
  const auto regressions = regressionInputs("ps_server_state");
  ASSERT_FALSE(regressions.empty());
  for (const Input& input : regressions) {
    SCOPED_TRACE(input.name);
    EXPECT_NE(formatErrorOf([&] { parse(input.bytes); }).find("server-0.safetensors"), std::string::npos);
  }
}

TEST(PsServerStateTest, FactsAreCountsOfThisServerAndOptimizer) {
  std::map<std::string, std::string> meta = {
      {"version", "12"}, {"server", "0"}, {"optimizer", "adam"}, {"lr", "0.1"}, {"step", "9"}};
  const ServerStateFacts facts = checkServerStateMetadata(meta, "f", 0, "adam");
  EXPECT_EQ(facts.version, 12);
  EXPECT_EQ(facts.step, 9);
  EXPECT_THROW(checkServerStateMetadata(meta, "f", 1, "adam"), Mismatch);
  EXPECT_THROW(checkServerStateMetadata(meta, "f", 0, "sgd"), Mismatch);
  for (const char* bad : {"", "-1", "1.5", "9223372036854775808", " 3", "3 ", "0x10"}) {
    auto broken = meta;
    broken["version"] = bad;
    EXPECT_NE(formatErrorOf([&] { checkServerStateMetadata(broken, "f", 0, "adam"); }).find("'version'"),
              std::string::npos)
        << bad;
  }
  meta.erase("server");
  EXPECT_NE(formatErrorOf([&] { checkServerStateMetadata(meta, "f", 0, "adam"); }).find("no 'server'"),
            std::string::npos);
}

}  // namespace
}  // namespace kolo::fuzz_regressions
