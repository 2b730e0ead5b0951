// The files kolo report and the observers read back (Chrome traces, flight-recorder dumps,
// rank traces to merge, metrics lines), fed the fuzzer's seeds and the files that once let a
// nlohmann::json type_error escape (a "ph" of 5, a "kolo" array, a "slowest_rank" string, a
// failed event's "signal" of 7) or cast 1e300 to int (a pid, a rank), or looped over 2^31
// ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fuzz_regressions/fuzz_inputs.h"
#include "kolo/hang_report.h"
#include "kolo/timeline.h"
#include "report/html.h"
#include "report/runs.h"
#include "report/timeline.h"

namespace kolo::fuzz_regressions {
namespace {

namespace fs = std::filesystem;

class ReportFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kolo-report-regressions-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// The harness's format: a mode byte (0 trace, 1 flight dump, 2 rank trace, 3 metrics),
  /// then the file, read as kolo report or the observers read it.
  void read(const std::vector<uint8_t>& b) {
    if (b.empty()) throw FormatError("empty input");
    const std::string bytes(b.begin() + 1, b.end());
    for (const auto& entry : fs::directory_iterator(dir_)) fs::remove(entry.path());
    const auto write = [&](const char* name) {
      std::ofstream(dir_ / name, std::ios::binary) << bytes;
      return (dir_ / name).string();
    };
    switch (b[0] % 4) {
      case 0:
        cli::report::timelineBreakdown({write("trace.json")});
        break;
      case 1:
        write("flight.rank0.json");
        observe::diagnoseHang(observe::loadFlightDumps(dir_.string()));
        break;
      case 2:
        write("trace.rank0.json");
        observe::mergeTimeline(dir_.string());
        break;
      default: {
        cli::report::Run run;
        std::istringstream in(bytes);
        cli::report::readMetricsLines(in, "metrics.jsonl", run);
        cli::report::renderHtml({run}, {});
      }
    }
  }

  fs::path dir_;
};

TEST_F(ReportFilesTest, SeedsAndRegressionsAreReadOrRefusedWithAKoloError) {
  const auto seeds = seedInputs("report");
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(expectParsesOrThrowsError(seeds, [&](const auto& b) { read(b); }),
            static_cast<int>(seeds.size()));
  const auto regressions = regressionInputs("report");
  ASSERT_FALSE(regressions.empty());
  expectParsesOrThrowsError(regressions, [&](const auto& b) { read(b); });
}

TEST_F(ReportFilesTest, TraceEventsOfOtherTypesArePassedOver) {
  const std::string trace =
      R"({"traceEvents":[{"ph":5},{"ph":"X","ts":0,"dur":10,"pid":1e300,"name":"step","cat":"train"},)"
      R"({"ph":"X","ts":0,"dur":10,"pid":0,"tid":"main","name":"step","cat":"train"},)"
      R"({"ph":"X","ts":0,"dur":10,"pid":2,"tid":1,"name":"step","cat":"train"}]})";
  std::ofstream(dir_ / "trace.json") << trace;
  const auto ranks = cli::report::timelineBreakdown({(dir_ / "trace.json").string()});
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].rank, 2);
}

TEST_F(ReportFilesTest, AFlightDumpOutOfRangeIsAFormatErrorNamingTheFieldAndFile) {
  const auto refusal = [&](const std::string& dump) {
    std::ofstream(dir_ / "flight.rank0.json") << dump;
    return formatErrorOf([&] { observe::loadFlightDumps(dir_.string()); });
  };
  const std::string ends = R"(,"dump_ns":1,"entries":[]})";
  EXPECT_NE(refusal(R"({"rank":1e300,"world_size":2)" + ends).find("\"rank\" is 1e+300"), std::string::npos);
  EXPECT_NE(refusal(R"({"rank":0,"world_size":2147483647)" + ends).find("\"world_size\""), std::string::npos);
  EXPECT_NE(refusal(R"({"rank":2,"world_size":2)" + ends).find("flight.rank0.json"), std::string::npos);
  EXPECT_NE(refusal(R"({"world_size":2)" + ends).find("no \"rank\""), std::string::npos);
}

TEST(ReportFieldsTest, MetricsLinesSortingFieldsMustHaveTheirTypes) {
  cli::report::Run run;
  std::istringstream good("{\"kind\":\"event\",\"event\":\"start\"}\n{\"epoch\":1}\n{\"final\":true}\n");
  cli::report::readMetricsLines(good, "m.jsonl", run);
  EXPECT_EQ(run.events.size(), 1u);
  EXPECT_EQ(run.epochs.size(), 1u);
  EXPECT_TRUE(run.final.has_value());
  for (const char* bad : {"{\"kind\":3}\n{}\n", "{\"final\":\"yes\"}\n{}\n", "{\"kind\":\"event\",\"event\":[]}\n{}\n"}) {
    std::istringstream in(bad);
    EXPECT_NE(formatErrorOf([&] { cli::report::readMetricsLines(in, "m.jsonl", run); }).find("m.jsonl:1"),
              std::string::npos)
        << bad;
  }
  const nlohmann::json line = {{"rank", 1e300}, {"signal", 7}, {"wall_s", "late"}, {"big", 1ull << 40}};
  EXPECT_EQ(cli::report::intField(line, "rank", -1), -1);
  EXPECT_EQ(cli::report::intField(line, "big", -1), -1);
  EXPECT_EQ(cli::report::textField(line, "signal", "?"), "?");
  EXPECT_EQ(cli::report::numberField(line, "wall_s", 0.5), 0.5);
}

}  // namespace
}  // namespace kolo::fuzz_regressions
