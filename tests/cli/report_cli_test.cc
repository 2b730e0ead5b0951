// End-to-end `kolo report` and the live view. Metrics lines in kolo train's format for two
// runs: the page holds every plot as well-formed inline SVG and the summary, and needs
// nothing from the network; bad run directories are named; headless Chromium loads the page
// with no console message (slow; skipped without chromium). Real runs (slow): a two-rank run
// under `kolo run --status-file` and a one-device run reported together, their interval
// lines, and `kolo status` showing both ranks done.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "run_kolo.h"
#include "support/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;

/// Whether `kolo status` printed a line "RANK PID done 16/16 ..." for `rank`.
bool statusShowsDone(const std::string& output, int rank) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string r, pid, state, steps;
    fields >> r >> pid >> state >> steps;
    if (r == std::to_string(rank) && !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos &&
        state == "done" && steps == "16/16")
      return true;
  }
  return false;
}

using kolo::testing::RunResult;
using kolo::testing::runKolo;

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether `xml` is well formed as far as a browser's XML parser cares: every element closed
// in order, attributes quoted, comments and declarations closed. Returns "" or the problem.
std::string xmlProblem(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    if (xml.compare(i, 4, "<!--") == 0) {
      const size_t end = xml.find("-->", i);
      if (end == std::string::npos) return "unclosed comment";
      i = end + 3;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0 || xml.compare(i, 2, "<!") == 0) {
      i = xml.find('>', i);
      if (i == std::string::npos) return "unclosed declaration";
      continue;
    }
    // Find the tag's end outside quoted attribute values.
    size_t j = i + 1;
    char quote = 0;
    for (; j < xml.size(); ++j) {
      if (quote) {
        if (xml[j] == quote) quote = 0;
      } else if (xml[j] == '"' || xml[j] == '\'') {
        quote = xml[j];
      } else if (xml[j] == '>') {
        break;
      } else if (xml[j] == '<') {
        return "'<' inside a tag at " + std::to_string(j);
      }
    }
    if (j >= xml.size()) return "unclosed tag at " + std::to_string(i);
    const std::string tag = xml.substr(i + 1, j - i - 1);
    const bool closing = !tag.empty() && tag[0] == '/';
    const bool selfClosing = !tag.empty() && tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \t\r\n/"));
    if (closing) {
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes <" + (open.empty() ? "" : open.back()) + ">";
      open.pop_back();
    } else if (!selfClosing) {
      open.push_back(name);
    }
    i = j + 1;
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

// kolo report draws with gnuplot; without it the drawing cases skip with this reason.
bool gnuplotInstalled() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }
#define KOLO_SKIP_WITHOUT_GNUPLOT() \
  if (gnuplotInstalled()) {         \
  } else                            \
    GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox; scripts/setup.sh does)"

const std::vector<std::string> kPlots = {"loss-step",       "loss-time",      "accuracy-step",
                                         "accuracy-time",   "rank-throughput", "step-breakdown",
                                         "comm-volume",     "comm-bandwidth", "events"};

// Checks the page's structure: every plot a figure with a well-formed inline SVG that draws
// something, also written as its own file with its gnuplot script; nothing from the network.
void expectEveryPlot(const fs::path& out) {
  const std::string html = readFile(out / "index.html");
  ASSERT_FALSE(html.empty());
  for (const std::string& id : kPlots) {
    const size_t figure = html.find("<figure id=\"plot-" + id + "\">");
    ASSERT_NE(figure, std::string::npos) << id;
    const size_t svgStart = html.find("<svg", figure);
    const size_t figureEnd = html.find("</figure>", figure);
    ASSERT_LT(svgStart, figureEnd) << id << ": no inline SVG";
    const size_t svgEnd = html.find("</svg>", svgStart);
    ASSERT_LT(svgEnd, figureEnd) << id;
    const std::string svg = html.substr(svgStart, svgEnd + 6 - svgStart);
    EXPECT_EQ(xmlProblem(svg), "") << id;
    // At least one drawn line or bar besides the frame.
    EXPECT_NE(svg.find("<path"), std::string::npos) << id;
    // Ids carry the plot's prefix, so that nine SVGs in one page share none.
    EXPECT_EQ(svg.find("id='gp"), std::string::npos) << id;
    EXPECT_EQ(xmlProblem(readFile(out / (id + ".svg"))), "") << id << ".svg";
    EXPECT_TRUE(fs::exists(out / "plots" / (id + ".gp"))) << id;
  }
  EXPECT_EQ(xmlProblem(html.substr(html.find("<html"))), "");
  // Self-contained: no script, no stylesheet or image fetched from anywhere.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  for (const char* remote : {R"(href="//)", R"(href="http://)", R"(href="https://)"})
    EXPECT_EQ(html.find(remote), std::string::npos) << remote;
}

// Metrics lines as kolo train writes them (the fields of train_run.cc and
// train_monitor.cc), for a two-rank run whose rank 1 is slow and a one-rank run.
void writeRun(const fs::path& dir, int ranks, double slowFactor) {
  fs::create_directories(dir);
  std::ofstream out(dir / "metrics.jsonl");
  out << "{\"kind\":\"event\",\"event\":\"start\",\"step\":0,\"wall_s\":0.0,\"ranks\":" << ranks
      << ",\"replicas\":" << ranks << ",\"strategy\":\""
      << (ranks > 1 ? "multi-worker-mirrored" : "one-device")
      << "\",\"algorithm\":\"ring\",\"batch\":64}\n";
  for (int i = 1; i <= 8; ++i) {
    const int step = 10 * i;
    out << "{\"kind\":\"interval\",\"step\":" << step << ",\"wall_s\":" << 0.1 * i
        << ",\"train_loss\":" << 2.0 / i << ",\"step_s\":0.01,\"slowest_rank\":" << ranks - 1;
    if (ranks > 1) out << ",\"comm_bytes\":" << 1e7 * step << ",\"comm_gbps\":1.5,\"algorithm\":\"ring\"";
    out << ",\"ranks\":[";
    for (int r = 0; r < ranks; ++r) {
      const double compute = 0.004 * (r == 1 ? slowFactor : 1.0);
      out << (r ? "," : "") << "{\"rank\":" << r << ",\"samples_per_s\":" << 32 / compute
          << ",\"data_s\":0.0002,\"compute_s\":" << compute << ",\"comm_s\":0.003"
          << ",\"exposed_comm_s\":0.001,\"wait_s\":" << (r == 1 ? 0.0 : 0.004 * (slowFactor - 1))
          << ",\"step_s\":0.01}";
    }
    out << "]}\n";
    if (i % 4 == 0) {
      out << "{\"epoch\":" << i / 4 << ",\"step\":" << step << ",\"train_loss\":" << 2.0 / i
          << ",\"test_accuracy\":" << 0.6 + 0.05 * i << ",\"samples_per_s\":5000,\"wall_s\":"
          << 0.1 * i + 0.05 << "}\n";
      out << "{\"kind\":\"event\",\"event\":\"checkpoint\",\"step\":" << step
          << ",\"wall_s\":" << 0.1 * i + 0.06 << "}\n";
    }
  }
  out << "{\"epoch\":2,\"step\":80,\"train_loss\":0.25,\"test_accuracy\":0.99,"
         "\"samples_per_s\":5000,\"steady_samples_per_s\":5500,\"wall_s\":0.95,\"final\":true}\n"
      << "{\"kind\":\"event\",\"event\":\"end\",\"step\":80,\"wall_s\":0.96}\n";
}

class ReportCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kolo_report_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ReportCliTest, PageHoldsEveryPlotAsWellFormedInlineSvgAndTheSummary) {
  KOLO_SKIP_WITHOUT_GNUPLOT();
  writeRun(dir_ / "ring2", 2, 1.5);
  writeRun(dir_ / "single", 1, 1.0);
  const RunResult report = runKolo("report " + (dir_ / "ring2").string() + " " +
                                   (dir_ / "single").string() + " -o " + (dir_ / "out").string());
  ASSERT_EQ(report.exitCode, 0) << report.output;
  EXPECT_NE(report.output.find("2 run(s), 9 of 9 plots drawn"), std::string::npos) << report.output;
  expectEveryPlot(dir_ / "out");
  const std::string html = readFile(dir_ / "out" / "index.html");
  EXPECT_NE(html.find("<td class=\"text\">ring2</td><td class=\"text\">multi-worker-mirrored</td>"
                      "<td>2</td><td class=\"text\">ring</td><td>64</td><td>80</td><td>2</td>"
                      "<td>0.2500</td><td>0.9900</td><td>5000</td><td>5500</td><td>0.9</td><td>0</td>"
                      "<td class=\"text\">1 (8 of 8 intervals)</td><td class=\"text\">finished</td>"),
            std::string::npos)
      << html.substr(0, 4000);
  // Both runs in the legends of the overlaid plots, each rank in the throughput plot.
  for (const char* legend : {">ring2<", ">single<", ">ring2 rank 1<", ">single rank 0<"})
    EXPECT_NE(html.find(legend), std::string::npos) << legend;
  EXPECT_NE(html.find(">ring (2 ranks)<"), std::string::npos);

  // One run alone: the report goes to RUN_DIR/report, and a one-process run has no
  // communication plots, which say why.
  const RunResult alone = runKolo("report " + (dir_ / "single").string());
  ASSERT_EQ(alone.exitCode, 0) << alone.output;
  const std::string single = readFile(dir_ / "single" / "report" / "index.html");
  EXPECT_NE(single.find("<figure id=\"plot-comm-volume\" class=\"empty\">"), std::string::npos);
  EXPECT_NE(single.find("no communication (one process)"), std::string::npos);
}

// A run with a timeline: the breakdown per rank from its step spans. Rank 0's two steps of
// 10 ms each hold 1 ms of data, 5 ms of compute (3 + 2; a compute span nested in another and a
// module span are not counted again), 3 ms of gradient sync and 1 ms of nothing, while its
// progress thread all-reduces from 5 to 7 ms: 4 ms of communication in all (the union with
// the sync). Rank 1's one step is 8 ms of compute.
TEST_F(ReportCliTest, TimelineBreakdownPerRankFromTheStepSpans) {
  KOLO_SKIP_WITHOUT_GNUPLOT();
  writeRun(dir_ / "timed", 1, 1.0);
  std::ofstream trace(dir_ / "timed" / "trace.json");
  auto x = [&](int pid, int tid, const char* name, const char* cat, double ts, double dur) {
    trace << "{\"ph\":\"X\",\"name\":\"" << name << "\",\"cat\":\"" << cat << "\",\"ts\":" << ts
          << ",\"dur\":" << dur << ",\"pid\":" << pid << ",\"tid\":" << tid << ",\"args\":{}},\n";
  };
  trace << "{\"traceEvents\":[\n";
  for (double t0 : {0.0, 10000.0}) {
    x(0, 1, "step", "train", t0, 10000);
    x(0, 1, "data", "data", t0, 1000);
    x(0, 1, "forward", "compute", t0 + 1000, 3000);
    x(0, 1, "forward 0 Linear", "module", t0 + 1500, 1000);
    x(0, 1, "backward", "compute", t0 + 4000, 2000);
    x(0, 1, "inner", "compute", t0 + 4500, 500);
    x(0, 1, "gradient sync", "comm", t0 + 6000, 3000);
    x(0, 2, "allreduce", "comm", t0 + 5000, 2000);
  }
  x(1, 7, "step", "train", 0, 8000);
  x(1, 7, "forward", "compute", 0, 8000);
  trace << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"rank 0\"}}]}\n";
  trace.close();
  const RunResult report = runKolo("report " + (dir_ / "timed").string() + " -o " + (dir_ / "out").string());
  ASSERT_EQ(report.exitCode, 0) << report.output;
  EXPECT_NE(report.output.find("1 run(s), 9 of 11 plots drawn"), std::string::npos) << report.output;
  const std::string steps = readFile(dir_ / "out" / "plots" / "timeline-breakdown.gp");
  EXPECT_NE(steps.find("\"timed r0\" 1 5 3 1\n"), std::string::npos) << steps;
  EXPECT_NE(steps.find("\"timed r1\" 0 8 0 0\n"), std::string::npos) << steps;
  const std::string comm = readFile(dir_ / "out" / "plots" / "timeline-comm.gp");
  EXPECT_NE(comm.find("\"timed r0\" 4 3\n"), std::string::npos) << comm;
  const std::string html = readFile(dir_ / "out" / "index.html");
  EXPECT_NE(html.find("Step-time breakdown per rank, from the timeline"), std::string::npos);

  // A trace file that is not JSON is named.
  std::ofstream(dir_ / "timed" / "trace.json") << "{\"traceEvents\": [";
  const RunResult bad = runKolo("report " + (dir_ / "timed").string() + " -o " + (dir_ / "out2").string());
  EXPECT_NE(bad.exitCode, 0) << bad.output;
  EXPECT_NE(bad.output.find("trace.json is not a Chrome trace"), std::string::npos) << bad.output;
}

TEST_F(ReportCliTest, BadRunDirectoriesAreNamed) {
  const RunResult missing = runKolo("report " + (dir_ / "missing").string());
  EXPECT_EQ(missing.exitCode, 3) << missing.output;
  EXPECT_NE(missing.output.find("missing is not a directory"), std::string::npos) << missing.output;
  fs::create_directories(dir_ / "empty");
  const RunResult empty = runKolo("report " + (dir_ / "empty").string());
  EXPECT_EQ(empty.exitCode, 3) << empty.output;
  EXPECT_NE(empty.output.find("holds no metrics file"), std::string::npos) << empty.output;
  fs::create_directories(dir_ / "broken");
  std::ofstream(dir_ / "broken" / "m.jsonl") << "{\"epoch\":1}\nnot json\n{\"epoch\":2}\n";
  const RunResult broken = runKolo("report " + (dir_ / "broken").string());
  EXPECT_EQ(broken.exitCode, 3) << broken.output;
  EXPECT_NE(broken.output.find("m.jsonl:2 is not a JSON object"), std::string::npos) << broken.output;
  const RunResult none = runKolo("report");
  EXPECT_EQ(none.exitCode, 2) << none.output;
}

TEST_F(ReportCliTest, ChromiumLoadsThePageWithoutConsoleMessages) {
  KOLO_SKIP_WITHOUT_GNUPLOT();
  const char* browsers[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser"};
  std::string browser;
  for (const char* b : browsers)
    if (fs::exists(b)) browser = b;
  if (browser.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  writeRun(dir_ / "ring2", 2, 1.5);
  writeRun(dir_ / "single", 1, 1.0);
  const RunResult report = runKolo("report " + (dir_ / "ring2").string() + " " +
                                   (dir_ / "single").string() + " -o " + (dir_ / "out").string());
  ASSERT_EQ(report.exitCode, 0) << report.output;
  const fs::path shot = dir_ / "report.png";
  // Console messages (errors included) appear as INFO:CONSOLE lines with logging on stderr.
  const std::string command = browser +
                              " --headless --no-sandbox --disable-gpu --hide-scrollbars "
                              "--enable-logging=stderr --v=0 --window-size=1400,2400 "
                              "--screenshot=" +
                              shot.string() + " file://" + (dir_ / "out" / "index.html").string() +
                              " 2>&1";
  std::string output;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
  ::pclose(pipe);
  EXPECT_EQ(output.find(":CONSOLE"), std::string::npos) << output;
  ASSERT_TRUE(fs::exists(shot)) << output;
  EXPECT_GT(fs::file_size(shot), 50000u) << "a blank page would be a few kilobytes";
  const std::string png = readFile(shot).substr(0, 8);
  EXPECT_EQ(png, "\x89PNG\r\n\x1a\n");
}

// Real runs: two ranks under kolo run --status-file (metrics every 4 steps, checkpoints)
// and one device, reported together. Labelled slow (training processes).
class ReportRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!kolo::testing::fashionMnistInstalled()) return;
    dir_ = fs::temp_directory_path() / ("kolo_report_run_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "two");
    fs::create_directories(dir_ / "one");
    const std::string recipe =
        " --model mlp --batch 64 --optimizer sgd --lr 0.05 --train-limit 512 --epochs 2 "
        "--metrics-every 4 --quiet ";
    const std::string kolo = std::string(KOLO_BINARY_DIR) + "/src/cli/kolo";
    two_ = runKolo("run -n 2 --status-file " + (dir_ / "status").string() + " -- " + kolo +
                   " train --strategy multi-worker-mirrored" + recipe + "--metrics " +
                   (dir_ / "two" / "metrics.jsonl").string() + " --checkpoint-dir " +
                   (dir_ / "two" / "ckpt").string() + " --checkpoint-every 5");
    one_ = runKolo("train" + recipe + "--metrics " + (dir_ / "one" / "metrics.jsonl").string());
    report_ = runKolo("report " + (dir_ / "two").string() + " " + (dir_ / "one").string() +
                      " -o " + (dir_ / "out").string());
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    KOLO_SKIP_WITHOUT_GNUPLOT();
    ASSERT_EQ(two_.exitCode, 0) << two_.output;
    ASSERT_EQ(one_.exitCode, 0) << one_.output;
    ASSERT_EQ(report_.exitCode, 0) << report_.output;
  }
  static inline fs::path dir_;
  static inline RunResult two_, one_, report_;
};

TEST_F(ReportRunTest, PageIntervalLinesAndStatusOfRealRuns) {
  EXPECT_NE(report_.output.find("2 run(s), 9 of 9 plots drawn"), std::string::npos) << report_.output;
  expectEveryPlot(dir_ / "out");
  const std::string html = readFile(dir_ / "out" / "index.html");
  // The summary rows: name, strategy, ranks; both finished after 16 steps (2 epochs of 8).
  const size_t two = html.find(R"(<td class="text">two</td><td class="text">multi-worker-mirrored</td><td>2</td>)");
  ASSERT_NE(two, std::string::npos) << html.substr(0, 3000);
  EXPECT_NE(html.find("<td>16</td><td>2</td>", two), std::string::npos) << html.substr(0, 3000);
  EXPECT_NE(html.find(R"(<td class="text">one</td><td class="text">one-device</td><td>1</td>)"), std::string::npos);
  // Checkpoints every 5 steps and at the end; the last 3 are kept.
  EXPECT_NE(html.find("checkpoints at steps 10 15 16"), std::string::npos);
  for (const char* event : {">start<", ">checkpoint<", ">end<"})
    EXPECT_NE(html.find(event), std::string::npos) << event;

  // Every interval line holds every rank's breakdown.
  std::ifstream in(dir_ / "two" / "metrics.jsonl");
  std::string line;
  int intervals = 0;
  while (std::getline(in, line)) {
    if (line.find("\"kind\":\"interval\"") == std::string::npos) continue;
    ++intervals;
    for (const char* key : {"\"data_s\"", "\"compute_s\"", "\"comm_s\"", "\"exposed_comm_s\"",
                            "\"wait_s\"", "\"slowest_rank\"", "\"comm_bytes\"", "\"comm_gbps\"",
                            "\"rank\":0", "\"rank\":1"})
      EXPECT_NE(line.find(key), std::string::npos) << key << " in " << line;
  }
  EXPECT_EQ(intervals, 4);  // every 4 of 16 steps

  // kolo status shows both ranks done.
  const RunResult status = runKolo("status " + (dir_ / "status").string());
  ASSERT_EQ(status.exitCode, 0) << status.output;
  EXPECT_TRUE(statusShowsDone(status.output, 0)) << status.output;
  EXPECT_TRUE(statusShowsDone(status.output, 1)) << status.output;
  const RunResult none = runKolo("status " + (dir_ / "nothing").string());
  EXPECT_EQ(none.exitCode, 3) << none.output;
  EXPECT_NE(none.output.find("no rank has written"), std::string::npos) << none.output;
}

}  // namespace
