// What elastic ranks read from the store, fed the fuzzer's seeds and the texts that once
// escaped as std::invalid_argument or std::out_of_range (std::stoll, std::stoi) or were
// taken in part ("5 0 1 x" read as members {1}), and each refusal.
#include <gtest/gtest.h>

#include <climits>

#include "fuzz_regressions/fuzz_inputs.h"
#include "parallel/elastic/record.h"

namespace kolo::fuzz_regressions {
namespace {

using namespace parallel::detail;

/// The harness's format: a mode byte (0 record, 1 step, 2 joiner id), then the text.
void parse(const std::vector<uint8_t>& b) {
  if (b.empty()) throw FormatError("empty input");
  const std::string text(b.begin() + 1, b.end());
  if (b[0] % 3 == 0) {
    parseElasticRecord(text, "g1/members");
  } else if (b[0] % 3 == 1) {
    parseElasticNumber(text, "g1/in/0", INT64_MIN, INT64_MAX);
  } else {
    parseElasticNumber(text, "joiner/1", 0, INT_MAX);
  }
}

TEST(ElasticRecordTest, SeedsParseAndRegressionsThrowFormatError) {
  const auto seeds = seedInputs("elastic_record");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, parse), static_cast<int>(seeds.size()));
  const auto regressions = regressionInputs("elastic_record");
  ASSERT_FALSE(regressions.empty());
  for (const Input& input : regressions) {
    SCOPED_TRACE(input.name);
    formatErrorOf([&] { parse(input.bytes); });
  }
}

TEST(ElasticRecordTest, ARecordIsAStepTicketsAndDistinctRanks) {
  const ElasticRecord record = parseElasticRecord("-3 2\t0 4 7\n", "g2/members");
  EXPECT_EQ(record.step, -3);
  EXPECT_EQ(record.tickets, 2);
  EXPECT_EQ(record.members, (std::vector<int>{0, 4, 7}));
  EXPECT_TRUE(parseElasticRecord("0 0", "g").members.empty());
  for (const char* bad : {"", "5", "x 0 1", "5 -1 0", "5 0 -2", "5 0 2147483648", "5 0 1 x", "5 0 1 1",
                          "99999999999999999999 0 1"})
    EXPECT_NE(formatErrorOf([&] { parseElasticRecord(bad, "g2/members"); }).find("g2/members"),
              std::string::npos)
        << bad;
}

TEST(ElasticRecordTest, NumbersAreWholeIntegersInTheirRange) {
  EXPECT_EQ(parseElasticNumber("-7", "s", INT64_MIN, INT64_MAX), -7);
  EXPECT_EQ(parseElasticNumber("2147483647", "j", 0, INT_MAX), INT_MAX);
  for (const char* bad : {"", "x", "2147483648", "-1", "3 ", "3abc"})
    EXPECT_NE(formatErrorOf([&] { parseElasticNumber(bad, "joiner/4", 0, INT_MAX); }).find("joiner/4"),
              std::string::npos)
        << bad;
}

}  // namespace
}  // namespace kolo::fuzz_regressions
