// The native rendezvous records (rank, host segment and host table), fed the fuzzer's
// seeds, the inputs that once got through, and hand-made records with each field malformed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/native/rank_record.h"
#include "fuzz_regressions/fuzz_inputs.h"

namespace kolo::fuzz_regressions {
namespace {

using namespace comm::native;

/// The harness's input format: a mode byte (even: a rank's record, 1 mod 4: the host
/// segment record, 3 mod 4: the host table after a byte of rank count - 1), then the text.
void parseInput(const std::vector<uint8_t>& b) {
  if (b.empty()) throw FormatError("empty input");
  const std::string text(b.begin() + 1, b.end());
  if (b[0] % 2 == 0) {
    decodeRankRecord(text, 5);
  } else if (b[0] % 4 == 3) {
    if (text.empty()) throw FormatError("no rank count");
    decodeHostTable(text.substr(1), 1 + static_cast<uint8_t>(text[0]));
  } else {
    decodeHostSegmentRecord(text, 5);
  }
}

RankRecord valid() {
  RankRecord r;
  r.hostId = "node0/boot/4026531840";
  r.pid = 4242;
  r.port = 40123;
  r.addresses = {"10.0.0.5", "fd00::7", "127.0.0.1"};
  r.probeAddress = 140737488346112u;
  r.probeValue = 18446744073709551615u;
  r.cpus = {0, 2, 5};
  return r;
}

/// The text of valid() with line `line` (0: host id .. 5: cpus, 6: first address) replaced.
std::string withLine(size_t line, const std::string& value) {
  std::vector<std::string> lines;
  const std::string text = encodeRankRecord(valid());
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(text.substr(start, end - start));
  lines.at(line) = value;
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::string rankError(const std::string& text) {
  const std::string message = formatErrorOf([&] { decodeRankRecord(text, 7); });
  EXPECT_NE(message.find("rank 7"), std::string::npos) << message;
  return message;
}

TEST(RankRecordTest, SeedsParseAndRegressionsThrow) {
  const auto seeds = seedInputs("rank_record");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parseInput), static_cast<int>(seeds.size()));
  const auto regressions = regressionInputs("rank_record");
  ASSERT_FALSE(regressions.empty());
  EXPECT_EQ(expectParsesOrThrowsError(regressions, parseInput), 0);
}

TEST(RankRecordTest, RoundTrips) {
  EXPECT_EQ(decodeRankRecord(encodeRankRecord(valid()), 0), valid());
  RankRecord noCpus = valid();
  noCpus.cpus.clear();
  EXPECT_EQ(decodeRankRecord(encodeRankRecord(noCpus), 0), noCpus);
  const HostSegmentRecord segment{4242, 17, ""};
  EXPECT_EQ(encodeHostSegmentRecord(segment), "4242 17");
  EXPECT_EQ(decodeHostSegmentRecord("4242 17", 0), segment);
  const HostSegmentRecord failed{0, -1, "no room"};
  EXPECT_EQ(decodeHostSegmentRecord(encodeHostSegmentRecord(failed), 0), failed);
}

TEST(RankRecordTest, MalformedNumbersThrowFormatErrorNamingTheRank) {
  EXPECT_NE(rankError(withLine(1, "12abc")).find("pid '12abc'"), std::string::npos);
  EXPECT_NE(rankError(withLine(1, "0")).find("pid"), std::string::npos);
  EXPECT_NE(rankError(withLine(1, "-5")).find("pid"), std::string::npos);
  EXPECT_NE(rankError(withLine(1, " 12")).find("pid"), std::string::npos);
  EXPECT_NE(rankError(withLine(1, "99999999999")).find("pid"), std::string::npos);
  EXPECT_NE(rankError(withLine(2, "0")).find("port '0'"), std::string::npos);
  EXPECT_NE(rankError(withLine(2, "65536")).find("port '65536'"), std::string::npos);
  EXPECT_NE(rankError(withLine(2, "+80")).find("port"), std::string::npos);
  EXPECT_NE(rankError(withLine(3, "18446744073709551616")).find("probe address"), std::string::npos);
  EXPECT_NE(rankError(withLine(4, "-1")).find("probe value"), std::string::npos);
  EXPECT_NE(rankError(withLine(4, "")).find("probe value"), std::string::npos);
}

TEST(RankRecordTest, CpuListsAreBounded) {
  // A cpu id sizes a per-host table in the rendezvous: 2^30 must not get that far.
  EXPECT_NE(rankError(withLine(5, "0,1073741824")).find("cpu '1073741824'"), std::string::npos);
  EXPECT_NE(rankError(withLine(5, std::to_string(kMaxCpuId))).find("cpu"), std::string::npos);
  EXPECT_NO_THROW(decodeRankRecord(withLine(5, std::to_string(kMaxCpuId - 1)), 7));
  EXPECT_NE(rankError(withLine(5, "-1")).find("cpu '-1'"), std::string::npos);
  EXPECT_NE(rankError(withLine(5, "1,,2")).find("cpu ''"), std::string::npos);
  EXPECT_NE(rankError(withLine(5, "1,2,")).find("ends with a comma"), std::string::npos);
  EXPECT_NE(rankError(withLine(5, "1 2")).find("cpu '1 2'"), std::string::npos);
  std::string many = "0";
  for (size_t i = 1; i <= kMaxRecordCpus; ++i) {
    many += ',';
    many += std::to_string(i % 64);
  }
  EXPECT_NE(rankError(withLine(5, many)).find("more than"), std::string::npos);
}

TEST(RankRecordTest, AddressesAndSizesAreBounded) {
  const std::string fixed = "h\n1\n2\n3\n4\n0\n";
  EXPECT_NE(rankError(fixed).find("fewer than"), std::string::npos);
  EXPECT_NE(rankError("").find("fewer than"), std::string::npos);
  EXPECT_NE(rankError("h\n1\n2\n3\n").find("fewer than"), std::string::npos);
  EXPECT_NE(rankError(fixed + "10.0.0.1\n\n").find("address ''"), std::string::npos);
  EXPECT_NE(rankError(fixed + std::string(kMaxAddressBytes + 1, 'a') + "\n").find("address"), std::string::npos);
  std::string many = fixed;
  for (size_t i = 0; i <= kMaxRecordAddresses; ++i) {
    many += "10.0.0.";
    many += std::to_string(i % 250);
    many += '\n';
  }
  EXPECT_NE(rankError(many).find("more than"), std::string::npos);
  EXPECT_NE(rankError(withLine(0, "")).find("host id"), std::string::npos);
  EXPECT_NE(rankError(withLine(0, std::string(kMaxHostIdBytes + 1, 'h'))).find("host id"), std::string::npos);
  EXPECT_NE(rankError(std::string(kMaxRecordBytes + 1, '\n')).find("bytes"), std::string::npos);
}

TEST(RankRecordTest, EncodeRefusesWhatDecodeWouldRefuse) {
  RankRecord r = valid();
  r.cpus.push_back(kMaxCpuId);
  EXPECT_THROW(encodeRankRecord(r), InvalidArgument);
  r = valid();
  r.addresses.clear();
  EXPECT_THROW(encodeRankRecord(r), InvalidArgument);
  r = valid();
  r.hostId = "a\nb";
  EXPECT_THROW(encodeRankRecord(r), InvalidArgument);
  EXPECT_THROW(encodeHostSegmentRecord({0, 3, ""}), InvalidArgument);
}

TEST(HostSegmentRecordTest, MalformedRecordsThrowFormatErrorNamingTheRank) {
  for (const std::string bad : {"", "12", "12 ", " 12 3", "12  3", "12 3 ", "0 3", "-4 3", "12 -1", "12 x",
                                "99999999999999999999 3", "12 4294967296", "error ", "errors 1"}) {
    SCOPED_TRACE("'" + bad + "'");
    const std::string message = formatErrorOf([&] { decodeHostSegmentRecord(bad, 9); });
    EXPECT_NE(message.find("rank 9"), std::string::npos) << message;
  }
  EXPECT_EQ(decodeHostSegmentRecord("error out of memory", 9).error, "out of memory");
  EXPECT_EQ(decodeHostSegmentRecord("2147483647 0", 9), (HostSegmentRecord{2147483647, 0, ""}));
}

std::string words(std::initializer_list<uint32_t> values) {
  std::string out;
  for (uint32_t v : values)
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xffu);
  return out;
}

TEST(HostTableTest, HostsOfAsManyConsecutiveRanksAreOneGroup) {
  const std::vector<uint32_t> hostOf = {0, 0, 0, 1, 1, 1, 2, 2, 2};
  const std::string table = encodeHostTable(hostOf);
  EXPECT_EQ(table, words({3, 0, 3}));
  EXPECT_EQ(decodeHostTable(table, 9), hostOf);
  // Uneven hosts: a group for each length.
  const std::vector<uint32_t> uneven = {0, 0, 1, 1, 2, 3, 3};
  EXPECT_EQ(encodeHostTable(uneven), words({2, 0, 2, 1, 2, 1, 2, 3, 1}));
  EXPECT_EQ(decodeHostTable(encodeHostTable(uneven), 7), uneven);
}

TEST(HostTableTest, InterleavedHostsRoundTrip) {
  const std::vector<uint32_t> hostOf = {0, 1, 0, 1, 2, 2, 0};
  EXPECT_EQ(encodeHostTable(hostOf), words({1, 0, 2, 1, 0, 2, 2, 2, 1, 1, 0, 1}));
  EXPECT_EQ(decodeHostTable(encodeHostTable(hostOf), 7), hostOf);
  EXPECT_EQ(decodeHostTable(encodeHostTable({0}), 1), std::vector<uint32_t>{0});
}

TEST(HostTableTest, MalformedTablesThrowFormatError) {
  auto error = [](const std::string& bytes, int size) { return formatErrorOf([&] { decodeHostTable(bytes, size); }); };
  EXPECT_NE(error(words({3, 0, 1}) + "x", 3).find("whole number"), std::string::npos);
  EXPECT_NE(error(words({0, 0, 1, 3, 1, 1}), 3).find("empty run"), std::string::npos);
  EXPECT_NE(error(words({3, 0, 0}), 3).find("no runs"), std::string::npos);
  EXPECT_NE(error(words({2, 0, 1, 2, 1, 1}), 3).find("more than 3"), std::string::npos);
  EXPECT_NE(error(words({1, 0, 4}), 3).find("more than 3"), std::string::npos);
  EXPECT_NE(error(words({2, 0, 1}), 3).find("not 3"), std::string::npos);
  EXPECT_NE(error(words({1, 0, 1, 1, 2, 1, 1, 1, 1}), 3).find("host 2 appears before host 1"), std::string::npos);
  EXPECT_NE(error(words({1, 0, 1, 2, 0, 1}), 3).find("adjacent"), std::string::npos);
  EXPECT_NE(error(words({1, 0, 1, 1, 1, 1}), 2).find("continues the one before"), std::string::npos);
  EXPECT_NE(error(words({1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1}), 3).find("more groups than ranks"), std::string::npos);
  EXPECT_NE(error(words({4294967295u, 0, 1}), 3).find("more than 3"), std::string::npos);
  EXPECT_NE(error(words({65536, 0, 65536}), 3).find("more than 3"), std::string::npos);
}

TEST(HostTableTest, EncodeRefusesHostsOutOfOrder) {
  EXPECT_THROW(encodeHostTable({1, 0}), InvalidArgument);
}

}  // namespace
}  // namespace kolo::fuzz_regressions
