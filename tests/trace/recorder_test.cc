// The recorders in one process: timeline spans per thread (nesting, thread names, the
// buffer limit, the JSON of a rank) and the flight recorder's ring (wrapping, states, the
// dump and its conversion from the ring file).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "kolo/error.h"
#include "kolo/flight_recorder.h"
#include "kolo/trace.h"

namespace {

using namespace kolo;

TEST(TraceRecorderTest, SpansNestPerThreadAndCarryTheirFields) {
  trace::start({.directory = "", .spansPerThread = 64});
  trace::setRank(3, 4);
  std::thread other([] {
    trace::setThreadName("worker");
    trace::Scope outer("outer", "test");
    trace::Scope inner("inner", "test");
    inner.bytes(4096).seq(7).detail("ring");
  });
  other.join();
  {
    trace::Scope a("a", "test");
    trace::instant("mark", "test", 2);
  }
  const std::vector<trace::ThreadSpans> threads = trace::snapshot();
  ASSERT_EQ(threads.size(), 2u);
  const trace::ThreadSpans& worker = threads[0].name == "worker" ? threads[0] : threads[1];
  ASSERT_EQ(worker.spans.size(), 2u);
  EXPECT_STREQ(worker.spans[0].name, "inner");  // recorded when it ended, before its parent
  EXPECT_STREQ(worker.spans[1].name, "outer");
  EXPECT_LE(worker.spans[1].begin, worker.spans[0].begin);
  EXPECT_GE(worker.spans[1].end, worker.spans[0].end);
  EXPECT_EQ(worker.spans[0].bytes, 4096);

  const nlohmann::json j = nlohmann::json::parse(trace::rankJson());
  int complete = 0, instants = 0;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_TRUE(e.contains("dur") && e.contains("ts") && e.contains("tid"));
      if (e["name"] == "inner") {
        EXPECT_EQ(e["args"]["bytes"], 4096);
        EXPECT_EQ(e["args"]["seq"], 7);
        EXPECT_EQ(e["args"]["detail"], "ring");
      }
    }
    instants += e["ph"] == "i";
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(instants, 1);
  EXPECT_EQ(j["kolo"]["world_size"], 4);
  trace::stop();
}

TEST(TraceRecorderTest, AFullBufferCountsWhatItDrops) {
  trace::start({.directory = "", .spansPerThread = 4});
  for (int i = 0; i < 10; ++i) trace::Scope s("x", "test");
  const auto threads = trace::snapshot();
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads[0].spans.size(), 4u);
  EXPECT_EQ(threads[0].dropped, 6u);
  trace::stop();
  trace::Scope ignored("after stop", "test");
}

TEST(TraceRecorderTest, NothingIsRecordedWhenOff) {
  trace::start({.directory = ""});
  trace::stop();
  trace::start({.directory = ""});  // a new recording starts empty
  trace::stop();
  { trace::Scope s("off", "test"); }
  EXPECT_TRUE(trace::snapshot().empty() || trace::snapshot()[0].spans.empty());
}

// The flight recorder is one per process: a single test attaches it.
TEST(FlightRecorderTest, RingKeepsTheLastCollectivesAndDumpsThem) {
  char pattern[] = "/tmp/kolo-flight-test-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ::setenv("KOLO_DEBUG_DIR", dir.c_str(), 1);
  ::setenv("KOLO_FLIGHT_RECORDER", "16", 1);
  flight::attach(5, 8);
  ::unsetenv("KOLO_DEBUG_DIR");
  ::unsetenv("KOLO_FLIGHT_RECORDER");
  ASSERT_TRUE(flight::enabled());
  uint64_t last = 0;
  for (int k = 0; k < 40; ++k) {
    flight::Description d;
    d.seq = k;
    d.context = 1;
    d.groupRank = 5;
    d.groupSize = 8;
    d.op = "allreduce";
    d.dtype = "f32";
    d.reduce = "sum";
    d.algorithm = "auto";
    d.count = 100 + k;
    last = flight::begin(d);
    flight::started(last);
    if (k < 38) flight::finished(last);
  }
  flight::failed(last, "Timeout: no data from rank 2 after 2 s");
  flight::finished(1);  // long overwritten: ignored

  const std::string path = flight::dump("timeout");
  ASSERT_EQ(path, flight::dumpPath(dir, 5));
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["rank"], 5);
  EXPECT_EQ(j["reason"], "timeout");
  EXPECT_EQ(j["recorded"], 40);
  ASSERT_EQ(j["entries"].size(), 16u);
  EXPECT_EQ(j["entries"][0]["seq"], 24);
  EXPECT_EQ(j["entries"][15]["seq"], 39);
  EXPECT_EQ(j["entries"][15]["state"], "failed");
  EXPECT_EQ(j["entries"][15]["error"], "Timeout: no data from rank 2 after 2 s");
  EXPECT_EQ(j["entries"][14]["state"], "started");
  EXPECT_EQ(j["entries"][13]["state"], "done");
  EXPECT_EQ(j["entries"][13]["count"], 137);

  // The ring file alone (what kolo run reads of a rank that does not answer) gives the same.
  EXPECT_GT(flight::ringProgress(flight::ringPath(dir, 5)), 100);
  const std::string converted = dir + "/converted.json";
  flight::convertRingFile(flight::ringPath(dir, 5), converted, "stalled", "the process is stopped");
  std::ifstream in2(converted);
  const nlohmann::json c = nlohmann::json::parse(in2);
  EXPECT_EQ(c["note"], "the process is stopped");
  EXPECT_EQ(c["entries"], j["entries"]);
  EXPECT_THROW(flight::convertRingFile(converted, dir + "/x.json", "", ""), FormatError);
  EXPECT_THROW(flight::convertRingFile(dir + "/missing.ring", dir + "/x.json", "", ""), IoError);
  EXPECT_EQ(flight::ringProgress(dir + "/missing.ring"), -1);
  std::filesystem::remove_all(dir);
}

}  // namespace
