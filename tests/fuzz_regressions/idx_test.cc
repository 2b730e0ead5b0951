// The IDX parser, fed the fuzzer's seeds, the inputs that once broke it, and headers whose
// dimensions overflow, truncated data and gzip streams that inflate past their header.
#include <gtest/gtest.h>
#include <zlib.h>

#include "fuzz_regressions/fuzz_inputs.h"
#include "kolo/data.h"

namespace kolo::fuzz_regressions {
namespace {

data::IdxArray parse(const std::vector<uint8_t>& b) { return data::parseIdx(b.data(), b.size(), "test"); }

std::vector<uint8_t> idx(const std::vector<uint32_t>& dims, size_t values) {
  std::vector<uint8_t> b = {0, 0, 8, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(d >> shift));
  b.resize(b.size() + values, 7);
  return b;
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& raw) {
  z_stream stream{};
  deflateInit2(&stream, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::vector<uint8_t> out(deflateBound(&stream, raw.size()) + 64);
  stream.next_in = const_cast<Bytef*>(raw.data());
  stream.avail_in = static_cast<uInt>(raw.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

TEST(IdxParseTest, SeedsParseAndRegressionsThrow) {
  const auto seeds = seedInputs("idx");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parse), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("idx"), parse);
}

TEST(IdxParseTest, DimensionsWhoseProductWrapsAroundThrow) {
  // 2^20 * 2^20 * 2^24 = 2^64 wrapped to 0 elements, which an empty payload matched.
  EXPECT_NE(formatErrorOf([] { parse(idx({1u << 20, 1u << 20, 1u << 24}, 0)); }).find("implausibly"),
            std::string::npos);
  // A zero dimension empties the array but does not excuse the others.
  formatErrorOf([] { parse(idx({0, 0xffffffffu, 0xffffffffu}, 0)); });
  EXPECT_EQ(parse(idx({0, 28, 28}, 0)).values.size(), 0u);
  const data::IdxArray ok = parse(idx({2, 3}, 6));
  EXPECT_EQ(ok.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ok.values.size(), 6u);
}

TEST(IdxParseTest, TruncatedAndOversizedInputsThrow) {
  formatErrorOf([] { parse({}); });
  formatErrorOf([] { parse({0, 0, 8}); });
  formatErrorOf([] { parse({0, 0, 8, 0}); });
  formatErrorOf([] { parse({0, 0, 9, 1, 0, 0, 0, 0}); });
  EXPECT_NE(formatErrorOf([] { parse({0, 0, 8, 255, 0, 0}); }).find("truncated IDX header"),
            std::string::npos);
  EXPECT_NE(formatErrorOf([] { parse(idx({10}, 9)); }).find("truncated IDX data"), std::string::npos);
  EXPECT_NE(formatErrorOf([] { parse(idx({10}, 11)); }).find("extra"), std::string::npos);
}

TEST(IdxParseTest, GzipStopsAtWhatTheHeaderDeclares) {
  EXPECT_EQ(parse(gzip(idx({4, 4}, 16))).values.size(), 16u);
  // 8 MiB of data behind a header that declares 16 bytes: refused without inflating it all.
  EXPECT_NE(formatErrorOf([] { parse(gzip(idx({4, 4}, 8u << 20))); }).find("more than"),
            std::string::npos);
  std::vector<uint8_t> truncated = gzip(idx({4, 4}, 16));
  truncated.erase(truncated.end() - 6, truncated.end());  // the last 6 bytes: part of the trailer
  EXPECT_NE(formatErrorOf([&] { parse(truncated); }).find("gzip"), std::string::npos);
  formatErrorOf([] { parse({0x1f, 0x8b}); });
}

TEST(IdxParseTest, ALimitCountsItemsEvenWhenEachIsEmpty) {
  // [2, 0xd7000000, 0]: two items of no bytes; a limit of 1 keeps one of them (the fuzzer's
  // find: the limit was judged by bytes, and kept both).
  const std::vector<uint8_t> bytes = idx({2, 0xd7000000u, 0}, 0);
  const data::IdxArray one = data::parseIdx(bytes.data(), bytes.size(), "test", 1);
  EXPECT_EQ(one.dims, (std::vector<int64_t>{1, 0xd7000000, 0}));
  EXPECT_EQ(one.fileItems, 2);
  EXPECT_TRUE(one.values.empty());
}

TEST(IdxParseTest, AHeaderClaimingTerabytesReservesOnlyWhatTheStreamCanHold) {
  // 2^20 x 2^20 declared (1 TiB) behind a few compressed bytes: the buffer is sized by what
  // deflate can expand them to, and the read ends as truncated, whole or cut at a limit.
  const std::vector<uint8_t> claim = gzip(idx({1u << 20, 1u << 20}, 100));
  EXPECT_NE(formatErrorOf([&] { parse(claim); }).find("truncated"), std::string::npos);
  EXPECT_NE(formatErrorOf([&] { data::parseIdx(claim.data(), claim.size(), "test", 3); })
                .find("truncated"),
            std::string::npos);
}

}  // namespace
}  // namespace kolo::fuzz_regressions
