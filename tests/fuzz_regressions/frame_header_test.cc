// The native transports' frame-header check, fed the fuzzer's seeds, the inputs that once
// broke it, and headers with each field out of range.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/native/frame.h"
#include "fuzz_regressions/fuzz_inputs.h"

namespace kolo::fuzz_regressions {
namespace {

using namespace comm::native;

FrameHeader parse(const std::vector<uint8_t>& b) { return parseFrameHeader(b.data(), b.size()); }

std::vector<uint8_t> bytesOf(const FrameHeader& h) {
  std::vector<uint8_t> b(sizeof h);
  std::memcpy(b.data(), &h, sizeof h);
  return b;
}

FrameHeader allreduce() {
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::Collective);
  Signature s;
  s.collective = CollectiveKind::Allreduce;
  s.dtype = DType::F32;
  s.count = 10;
  h.setSignature(s);
  h.length = 40;
  return h;
}

TEST(FrameHeaderTest, SeedsParseAndRegressionsThrow) {
  const auto seeds = seedInputs("frame_header");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parse), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("frame_header"), parse);
}

TEST(FrameHeaderTest, EachFieldOutOfRangeThrowsFormatError) {
  EXPECT_EQ(parse(bytesOf(allreduce())).signature(), allreduce().signature());
  auto broken = [](auto change) {
    FrameHeader h = allreduce();
    change(h);
    return formatErrorOf([&] { parse(bytesOf(h)); });
  };
  EXPECT_NE(broken([](FrameHeader& h) { h.magic = 0; }).find("magic"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.kind = 0; }).find("kind"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.kind = 4; }).find("kind"), std::string::npos);
  // An Abort's reason is short text: a longer one is not buffered.
  EXPECT_NE(broken([](FrameHeader& h) {
              h.kind = static_cast<uint8_t>(FrameKind::Abort);
              h.length = kMaxAbortBytes + 1;
            }).find("abort message"),
            std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.collective = 200; }).find("collective"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.dtype = 7; }).find("dtype"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.op = 5; }).find("reduce op"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.algorithm = 6; }).find("algorithm"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& h) { h.length = kMaxFrameBytes + 1; }).find("length"),
            std::string::npos);
  // Short and long reads are not headers.
  std::vector<uint8_t> shortRead = bytesOf(allreduce());
  shortRead.pop_back();
  formatErrorOf([&] { parse(shortRead); });
  formatErrorOf([&] { parse({}); });
}

}  // namespace
}  // namespace kolo::fuzz_regressions
