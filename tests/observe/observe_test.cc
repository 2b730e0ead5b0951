// Metrics lines, plain and redrawn progress output, and the logger's line format.
#include "kolo/observe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kolo/error.h"

namespace kolo::observe {
namespace {

std::string readAll(std::FILE* file) {
  std::rewind(file);
  std::string text;
  char buffer[512];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, got);
  return text;
}

TEST(MetricsWriterTest, OneFlushedObjectPerLine) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kolo_metrics_" + std::to_string(::getpid()) + ".jsonl"))
                               .string();
  {
    MetricsWriter writer(path);
    writer.write({{"epoch", 1}, {"test_accuracy", 0.5}});
    // Flushed: readable before the writer closes.
    std::ifstream early(path);
    std::string line;
    ASSERT_TRUE(std::getline(early, line));
    EXPECT_EQ(line, R"({"epoch":1,"test_accuracy":0.5})");
    writer.write({{"epoch", 2}, {"final", true}});
  }
  std::ifstream in(path);
  std::string first, second, third;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_EQ(second, R"({"epoch":2,"final":true})");
  EXPECT_FALSE(std::getline(in, third));
  std::filesystem::remove(path);
  EXPECT_THROW(MetricsWriter("/nonexistent/dir/m.jsonl"), IoError);
}

TEST(FieldsTest, ValuesAsJsonAndAsLogText) {
  Fields fields{{"step", uint64_t{7}}, {"loss", 0.25f}, {"name", "mlp"}, {"done", false}};
  fields.set("step", 8).set("missing", nullptr).set("nan", std::nan(""));
  EXPECT_EQ(fields.json(), R"({"step":8,"loss":0.25,"name":"mlp","done":false,"missing":null,"nan":null})");
  EXPECT_EQ(Value("a \"quoted\" word").json(), R"("a \"quoted\" word")");
  EXPECT_EQ(Value("a \"quoted\" word").text(), "a \"quoted\" word");
  EXPECT_EQ(Value(int64_t{-3}).text(), "-3");
  EXPECT_EQ(Value(0.1).json(), "0.1");
  EXPECT_EQ(Value(true).text(), "true");
  EXPECT_EQ(Fields{}.json(), "{}");
  Fields nested{{"lost", Value::Array{Fields{{"worker", 1}, {"at_s", 3.5}}, 2}}};
  nested.update({{"alive", 2}, {"lost", Value::Array{}}});
  EXPECT_EQ(nested.json(), R"({"lost":[],"alive":2})");
  EXPECT_EQ(Value(Value::Array{Fields{{"worker", 1}}, "x"}).json(), R"([{"worker":1},"x"])");
}

TEST(ProgressBarTest, PlainLinesWhenNotATerminal) {
  std::FILE* out = std::tmpfile();
  ProgressBar bar("epoch 1/2", 250, out, 100, /*interactive=*/0);
  for (int i = 1; i <= 250; ++i) bar.update(i, "loss 1.0");
  bar.finish("done");
  bar.finish("ignored");
  EXPECT_EQ(readAll(out),
            "epoch 1/2 100/250 loss 1.0\nepoch 1/2 200/250 loss 1.0\nepoch 1/2 250/250 done\n");
  std::fclose(out);
}

TEST(ProgressBarTest, TerminalRedrawsOneLine) {
  std::FILE* out = std::tmpfile();
  ProgressBar bar("e", 4, out, 100, /*interactive=*/1);
  bar.update(1);
  bar.finish("ok");
  const std::string text = readAll(out);
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;  // one line, ended by finish()
  EXPECT_NE(text.find("\re [=======>"), std::string::npos) << text;
  EXPECT_NE(text.find("[==============================] 4/4 ok"), std::string::npos) << text;
}

TEST(LoggerTest, LevelRankAndFields) {
  std::FILE* out = std::tmpfile();
  Logger logger(out, LogLevel::Info, 3);
  logger.debug("hidden");
  logger.info("saved", {{"file", "w.safetensors"}, {"step", 20}});
  const std::string text = readAll(out);
  EXPECT_EQ(text.find("hidden"), std::string::npos);
  EXPECT_NE(text.find("Z INFO [rank 3] saved file=w.safetensors step=20\n"), std::string::npos)
      << text;
  EXPECT_EQ(parseLogLevel("warn"), LogLevel::Warn);
  EXPECT_THROW(parseLogLevel("loud"), InvalidArgument);
  std::fclose(out);
}

}  // namespace
}  // namespace kolo::observe
