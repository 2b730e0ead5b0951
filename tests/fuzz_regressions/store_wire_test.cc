// The TCP store's request and reply parsers and the stores' counter parsing, fed the
// fuzzers' seeds, the inputs that once broke them, and hand-made malformed bodies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "comm/store/store_detail.h"
#include "comm/store/tcp_wire.h"
#include "fuzz_regressions/fuzz_inputs.h"
#include "kolo/comm/stores.h"

namespace kolo::fuzz_regressions {
namespace {

using comm::Bytes;
using comm::detail::StoreOp;
using comm::detail::StoreStatus;
using comm::detail::WireWriter;

/// A body as the wire carries it: WireWriter's frame without its 4-byte length.
Bytes body(WireWriter& writer) {
  Bytes frame = writer.finish();
  return Bytes(frame.begin() + 4, frame.end());
}

comm::detail::StoreRequest parseRequest(const Bytes& b, bool authenticated = true) {
  return comm::detail::parseStoreRequest(b.data(), b.size(), authenticated, comm::kMaxStoreKeyBytes,
                                         comm::kMaxStoreValueBytes);
}

comm::detail::StoreReply parseReply(StoreOp op, const Bytes& b) {
  return comm::detail::parseStoreReply(op, b.data(), b.size());
}

TEST(StoreRequestTest, SeedsParseAndRegressionsThrow) {
  auto both = [](const std::vector<uint8_t>& b) {
    int parsed = 0;
    for (bool authenticated : {false, true}) {
      try {
        parseRequest(b, authenticated);
        ++parsed;
      } catch (const FormatError&) {
      }
    }
    if (parsed == 0) throw FormatError("neither before nor after Hello");
  };
  const auto seeds = seedInputs("tcp_request");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, both), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("tcp_request"), both);
}

TEST(StoreRequestTest, RoundTripsEveryOperation) {
  WireWriter wait;
  wait.u8(uint8_t(StoreOp::Wait)).u32(2).str("a").str("bb").u64(250);
  const auto request = parseRequest(body(wait));
  EXPECT_EQ(request.op, StoreOp::Wait);
  EXPECT_EQ(request.keys, (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(request.timeoutMs, 250u);
  WireWriter add;
  add.u8(uint8_t(StoreOp::Add)).str("n").u64(static_cast<uint64_t>(-4));
  EXPECT_EQ(parseRequest(body(add)).delta, -4);
  // A host store's barrier request counts its ranks' arrivals; zero arrivals is no request.
  WireWriter arrive;
  arrive.u8(uint8_t(StoreOp::Arrive)).str("b").u64(64).u64(16).u64(1000);
  const auto barrier = parseRequest(body(arrive));
  EXPECT_EQ(barrier.delta, 64);
  EXPECT_EQ(barrier.arrivals, 16);
  EXPECT_EQ(barrier.timeoutMs, 1000u);
  WireWriter none;
  none.u8(uint8_t(StoreOp::Arrive)).str("b").u64(64).u64(0).u64(1000);
  EXPECT_NE(formatErrorOf([&] { parseRequest(body(none)); }).find("0 arrivals"), std::string::npos);
  WireWriter available;
  available.u8(uint8_t(StoreOp::GetAvailable)).u32(1).str("k").u64(5);
  EXPECT_EQ(parseRequest(body(available)).keys, std::vector<std::string>{"k"});
}

TEST(StoreRequestTest, MalformedBodiesThrowFormatError) {
  EXPECT_NE(formatErrorOf([] { parseRequest({}); }).find("truncated"), std::string::npos);
  // Before Hello nothing else is served; after it, Hello is not accepted again.
  WireWriter set;
  set.u8(uint8_t(StoreOp::Set)).str("k").bytes({1});
  formatErrorOf([&] { parseRequest(body(set), false); });
  WireWriter hello;
  hello.u8(uint8_t(StoreOp::Hello)).u32(comm::detail::kTcpStoreMagic).u8(comm::detail::kTcpStoreVersion).str("t");
  const Bytes helloBody = body(hello);
  EXPECT_EQ(parseRequest(helloBody, false).token, "t");
  formatErrorOf([&] { parseRequest(helloBody, true); });
  WireWriter badMagic;
  badMagic.u8(uint8_t(StoreOp::Hello)).u32(0x12345678).u8(comm::detail::kTcpStoreVersion).str("t");
  formatErrorOf([&] { parseRequest(body(badMagic), false); });
  // A count of four billion keys in a few bytes is refused before anything is reserved.
  WireWriter manyKeys;
  manyKeys.u8(uint8_t(StoreOp::Wait)).u32(0xffffffffu).str("a").u64(0);
  EXPECT_NE(formatErrorOf([&] { parseRequest(body(manyKeys)); }).find("count"), std::string::npos);
  // A string length beyond the limit, and one beyond the body.
  WireWriter longKey;
  longKey.u8(uint8_t(StoreOp::Remove)).u32(0xffffffffu);
  EXPECT_NE(formatErrorOf([&] { parseRequest(body(longKey)); }).find("limit"), std::string::npos);
  WireWriter shortKey;
  shortKey.u8(uint8_t(StoreOp::Remove)).u32(100).u8('k');
  EXPECT_NE(formatErrorOf([&] { parseRequest(body(shortKey)); }).find("truncated"), std::string::npos);
  WireWriter emptyKey;
  emptyKey.u8(uint8_t(StoreOp::Remove)).str("");
  formatErrorOf([&] { parseRequest(body(emptyKey)); });
  WireWriter trailing;
  trailing.u8(uint8_t(StoreOp::Remove)).str("k").u8(0);
  EXPECT_NE(formatErrorOf([&] { parseRequest(body(trailing)); }).find("trailing"), std::string::npos);
  WireWriter unknown;
  unknown.u8(200);
  formatErrorOf([&] { parseRequest(body(unknown)); });
}

TEST(StoreReplyTest, SeedsParseAndRegressionsThrow) {
  auto parse = [](const std::vector<uint8_t>& b) {
    if (b.empty()) throw FormatError("empty input");
    parseReply(static_cast<StoreOp>(b[0] % 14), Bytes(b.begin() + 1, b.end()));
  };
  const auto seeds = seedInputs("tcp_reply");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parse), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("tcp_reply"), parse);
}

TEST(StoreReplyTest, MalformedRepliesThrowFormatError) {
  // A Timeout reply announcing four billion missing keys used to size a vector of that
  // many strings before reading any of them.
  WireWriter many;
  many.u8(uint8_t(StoreStatus::Timeout)).u32(0xffffffffu);
  EXPECT_NE(formatErrorOf([&] { parseReply(StoreOp::Wait, body(many)); }).find("count"),
            std::string::npos);
  WireWriter timeoutForSet;
  timeoutForSet.u8(uint8_t(StoreStatus::Timeout)).u32(0);
  formatErrorOf([&] { parseReply(StoreOp::Set, body(timeoutForSet)); });
  WireWriter unknownStatus;
  unknownStatus.u8(9);
  EXPECT_NE(formatErrorOf([&] { parseReply(StoreOp::Set, body(unknownStatus)); }).find("status"),
            std::string::npos);
  WireWriter truncatedValue;
  truncatedValue.u8(uint8_t(StoreStatus::Ok)).u32(64);
  formatErrorOf([&] { parseReply(StoreOp::Get, body(truncatedValue)); });
  WireWriter shortCounter;
  shortCounter.u8(uint8_t(StoreStatus::Ok)).u32(1);
  formatErrorOf([&] { parseReply(StoreOp::Add, body(shortCounter)); });
  // A get-available answer: a flag per key, a value after each present one.
  WireWriter available;
  available.u8(uint8_t(StoreStatus::Ok)).u32(3).u8(0).u8(1).str("v").u8(0);
  const auto answer = parseReply(StoreOp::GetAvailable, body(available));
  EXPECT_EQ(answer.present, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(answer.values[1], (Bytes{'v'}));
  WireWriter tooMany;
  tooMany.u8(uint8_t(StoreStatus::Ok)).u32(4).u8(0).u8(0);
  EXPECT_NE(formatErrorOf([&] { parseReply(StoreOp::GetAvailable, body(tooMany)); }).find("count"),
            std::string::npos);
  WireWriter error;
  error.u8(uint8_t(StoreStatus::Error)).str("no such counter");
  EXPECT_EQ(parseReply(StoreOp::Add, body(error)).message, "no such counter");
}

int64_t addTo(const std::vector<uint8_t>& b) {
  if (b.size() < 8) throw FormatError("no delta");
  int64_t delta;
  std::memcpy(&delta, b.data(), 8);
  const Bytes value(b.begin() + 8, b.end());
  return comm::detail::addToCounter("k", &value, delta);
}

TEST(StoreCounterTest, SeedsParseAndRegressionsThrow) {
  const auto seeds = seedInputs("store_counter");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, addTo), static_cast<int>(seeds.size()));
  expectParsesOrThrowsError(regressionInputs("store_counter"), addTo);
}

TEST(StoreCounterTest, OverflowAndGarbageThrowInvalidArgument) {
  const Bytes max = comm::detail::encodeCounter(std::numeric_limits<int64_t>::max());
  EXPECT_THROW(comm::detail::addToCounter("k", &max, 1), InvalidArgument);
  const Bytes min = comm::detail::encodeCounter(std::numeric_limits<int64_t>::min());
  EXPECT_THROW(comm::detail::addToCounter("k", &min, -1), InvalidArgument);
  EXPECT_EQ(comm::detail::addToCounter("k", &min, 1), std::numeric_limits<int64_t>::min() + 1);
  const Bytes tooLong = {'9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9',
                         '9', '9', '9', '9', '9', '9', '9', '9', '9', '9'};
  EXPECT_THROW(comm::detail::addToCounter("k", &tooLong, 0), InvalidArgument);
  const Bytes text = {'1', ' ', '2'};
  EXPECT_THROW(comm::detail::addToCounter("k", &text, 0), InvalidArgument);
  EXPECT_EQ(comm::detail::addToCounter("k", nullptr, 5), 5);
}

TEST(StoreCounterTest, EveryStoreRefusesAnOverflowingAdd) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("kolo_counter_" + std::to_string(::getpid()));
  for (auto store : {comm::makeMemoryStore(), comm::makeFileStore(dir)}) {
    store->add("n", std::numeric_limits<int64_t>::max());
    EXPECT_THROW(store->add("n", 1), InvalidArgument);
    EXPECT_EQ(store->add("n", 0), std::numeric_limits<int64_t>::max());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kolo::fuzz_regressions
