// Plots of `kolo report`: gnuplot scripts built from the runs' metrics, run through
// posix_spawn; the SVGs they write are read back for inlining into the page.
#include "report/plots.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "report/timeline.h"
#include "kolo/error.h"

extern char** environ;

namespace kolo::cli::report {
namespace {

namespace fs = std::filesystem;

// One line series: (x, y) points and its legend title.
struct Series {
  std::string title;
  std::vector<std::pair<double, double>> points;
};

std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string number(double value) {
  std::ostringstream out;
  out.precision(10);
  out << value;
  return out.str();
}

double field(const nlohmann::json& record, const char* key, double otherwise = 0.0) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : otherwise;
}

const char* kHeader =
    "set terminal svg size 760,380 dynamic noenhanced font 'DejaVu Sans,12' background '#ffffff'\n"
    "set border lc rgb '#555555'\n"
    "set grid lc rgb '#dddddd'\n"
    "set key outside right top noautotitle\n"
    "set colorsequence classic\n";

// Runs gnuplot on `script`; throws IoError with its message on failure.
void runGnuplot(const std::string& script, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const char* argv[] = {"gnuplot", script.c_str(), nullptr};
  pid_t pid = 0;
  const int error = ::posix_spawnp(&pid, "gnuplot", &actions, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error == ENOENT)
    KOLO_THROW(IoError, "kolo report draws its plots with gnuplot, which is not installed: "
               "apt-get install gnuplot-nox (scripts/setup.sh does)");
  if (error != 0) KOLO_THROW(IoError, "kolo report: cannot start gnuplot: ", std::strerror(error));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream in(log);
  std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::error_code ignored;
    fs::remove(log, ignored);
    return;
  }
  KOLO_THROW(IoError, "kolo report: gnuplot failed on ", script, ": ", message);
}

// Gives every id of one SVG a prefix, so that several inlined into one page do not share ids.
std::string prefixIds(std::string svg, const std::string& prefix) {
  const std::pair<std::string, std::string> patterns[] = {
      {"id='", "id='" + prefix}, {"id=\"", "id=\"" + prefix},
      {"href='#", "href='#" + prefix}, {"href=\"#", "href=\"#" + prefix},
      {"url(#", "url(#" + prefix}};
  for (const auto& [from, to] : patterns) {
    for (size_t at = svg.find(from); at != std::string::npos; at = svg.find(from, at + to.size()))
      svg.replace(at, from.size(), to);
  }
  // The XML declaration cannot appear inside an HTML page.
  const size_t start = svg.find("<svg");
  return start == std::string::npos ? svg : svg.substr(start);
}

class Drawer {
 public:
  explicit Drawer(std::string outDir) : outDir_(std::move(outDir)) {
    fs::create_directories(fs::path(outDir_) / "plots");
  }

  // A line plot of `series` (those without points left out).
  Plot lines(const std::string& id, const std::string& title, const std::string& caption,
             const std::string& xlabel, const std::string& ylabel, const std::vector<Series>& series,
             const std::string& extra = "", const std::string& empty = "no data",
             const std::string& style = "linespoints pt 7 ps 0.5 lw 2") {
    std::ostringstream script;
    std::vector<const Series*> drawn;
    for (const Series& s : series)
      if (!s.points.empty()) drawn.push_back(&s);
    if (drawn.empty()) return {id, title, caption, "", empty};
    // Margins inside the frame, so that a run with one point (one epoch) is not drawn on it.
    script << kHeader << "set offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05\n"
           << "set xlabel " << quoted(xlabel) << "\nset ylabel " << quoted(ylabel) << "\n" << extra;
    for (size_t i = 0; i < drawn.size(); ++i) {
      script << "$D" << i << " << EOD\n";
      for (const auto& [x, y] : drawn[i]->points) script << number(x) << " " << number(y) << "\n";
      script << "EOD\n";
    }
    script << "plot ";
    for (size_t i = 0; i < drawn.size(); ++i) {
      script << (i ? ", " : "") << "$D" << i << " using 1:2 with " << style << " title "
             << quoted(drawn[i]->title);
    }
    script << "\n";
    return draw(id, title, caption, script.str());
  }

  // Bars: one row per label, one value per column; stacked or clustered.
  Plot bars(const std::string& id, const std::string& title, const std::string& caption,
            const std::string& ylabel, const std::vector<std::string>& columns,
            const std::vector<std::pair<std::string, std::vector<double>>>& rows, bool stacked,
            const std::string& empty) {
    if (rows.empty()) return {id, title, caption, "", empty};
    std::ostringstream script;
    script << kHeader << "set ylabel " << quoted(ylabel) << "\nset yrange [0:*]\n"
           << "set style data histograms\nset style histogram "
           << (stacked ? "rowstacked" : "clustered gap 1") << "\n"
           << "set style fill solid 0.85 border rgb '#333333'\nset boxwidth 0.7\n"
           << "set xtics rotate by -25 left\n$D << EOD\n";
    for (const auto& [label, values] : rows) {
      std::string label2 = label;
      std::replace(label2.begin(), label2.end(), '"', '\'');
      script << '"' << label2 << '"';
      for (double v : values) script << " " << number(v);
      script << "\n";
    }
    script << "EOD\nplot ";
    for (size_t c = 0; c < columns.size(); ++c) {
      script << (c ? ", " : "") << "$D using " << c + 2 << (c == 0 ? ":xtic(1)" : "")
             << " title " << quoted(columns[c]);
    }
    script << "\n";
    return draw(id, title, caption, script.str());
  }

  Plot draw(const std::string& id, const std::string& title, const std::string& caption,
            const std::string& body) {
    const std::string svgPath = (fs::path(outDir_) / (id + ".svg")).string();
    const std::string scriptPath = (fs::path(outDir_) / "plots" / (id + ".gp")).string();
    {
      std::ofstream out(scriptPath);
      out << "# " << title << " (kolo report; run gnuplot on this file to redraw " << id << ".svg)\n"
          << body.substr(0, body.find('\n') + 1) << "set output " << quoted(svgPath) << "\n"
          << body.substr(body.find('\n') + 1);
      if (!out) KOLO_THROW(IoError, "kolo report: cannot write ", scriptPath);
    }
    runGnuplot(scriptPath, (fs::path(outDir_) / "plots" / (id + ".log")).string());
    std::ifstream in(svgPath);
    std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (svg.find("</svg>") == std::string::npos)
      KOLO_THROW(IoError, "kolo report: gnuplot wrote no complete SVG to ", svgPath);
    return {id, title, caption, prefixIds(svg, id + "-"), ""};
  }

 private:
  std::string outDir_;
};

// The step and wall-time points of `key` from the interval lines, or else the epoch lines.
Series curve(const Run& run, const char* key, const char* x, bool epochsOnly) {
  Series s{run.name, {}};
  const std::vector<nlohmann::json>& lines =
      !epochsOnly && !run.intervals.empty() ? run.intervals : run.epochs;
  for (const nlohmann::json& line : lines)
    if (line.contains(key) && line[key].is_number() && line.contains(x))
      s.points.emplace_back(field(line, x), field(line, key));
  if (epochsOnly && run.final && run.final->contains(key) && run.final->contains(x)) {
    const std::pair<double, double> last{field(*run.final, x), field(*run.final, key)};
    if (s.points.empty() || s.points.back().first < last.first) s.points.push_back(last);
  }
  return s;
}

// Vertical lines at the runs' checkpoints and failures on a plot against step.
std::string eventMarks(const std::vector<Run>& runs) {
  std::ostringstream out;
  for (const Run& run : runs) {
    for (const nlohmann::json& e : run.events) {
      const std::string name = e.value("event", "");
      if (name == "start" || name == "end" || !e.contains("step")) continue;  // kolo run's have no step
      const double step = field(e, "step");
      out << "set arrow from " << number(step) << ", graph 0 to " << number(step)
          << ", graph 1 nohead dt 2 lc rgb '" << (name == "failed" ? "#cc0000" : "#999999") << "'\n";
    }
  }
  return out.str();
}

}  // namespace

std::vector<Plot> drawPlots(const std::vector<Run>& runs, const std::string& outDir) {
  // The step-time breakdown from the timeline, when a run has one (read first: a bad trace
  // file fails before anything is drawn): what each rank's stepping thread spent its steps
  // on, and its communication on every thread.
  std::vector<std::pair<std::string, std::vector<double>>> timelineSteps, timelineComm;
  for (const Run& run : runs) {
    if (run.traces.empty()) continue;
    for (const RankTimeline& r : timelineBreakdown(run.traces)) {
      const std::string label = run.name + " r" + std::to_string(r.rank);
      timelineSteps.emplace_back(label, std::vector<double>{r.dataMs, r.computeMs, r.exposedMs, r.otherMs()});
      timelineComm.emplace_back(label, std::vector<double>{r.commMs, r.exposedMs});
    }
  }
  Drawer drawer(outDir);
  std::vector<Plot> plots;
  std::vector<Series> lossStep, lossWall, accStep, accWall, rankRates;
  for (const Run& run : runs) {
    lossStep.push_back(curve(run, "train_loss", "step", false));
    lossWall.push_back(curve(run, "train_loss", "wall_s", false));
    accStep.push_back(curve(run, "test_accuracy", "step", true));
    accWall.push_back(curve(run, "test_accuracy", "wall_s", true));
    std::map<int, Series> perRank;
    for (const nlohmann::json& line : run.intervals) {
      if (!line.contains("ranks")) continue;
      for (const nlohmann::json& r : line["ranks"]) {
        const int rank = intField(r, "rank", 0);
        Series& s = perRank[rank];
        s.title = run.name + " rank " + std::to_string(rank);
        s.points.emplace_back(field(line, "step"), field(r, "samples_per_s"));
      }
    }
    for (auto& [rank, s] : perRank) rankRates.push_back(std::move(s));
  }
  const std::string marks = eventMarks(runs);
  plots.push_back(drawer.lines("loss-step", "Training loss against step",
                               "Mean training loss per interval (or epoch); dashed lines: "
                               "checkpoints, red: a failure.",
                               "step", "train loss", lossStep, marks));
  plots.push_back(drawer.lines("loss-time", "Training loss against wall time",
                               "The same losses against seconds since the run started.",
                               "wall time (s)", "train loss", lossWall));
  plots.push_back(drawer.lines("accuracy-step", "Test accuracy against step",
                               "Test accuracy after every epoch and at the end.", "step",
                               "test accuracy", accStep, "", "no epoch line with test_accuracy"));
  plots.push_back(drawer.lines("accuracy-time", "Test accuracy against wall time",
                               "The same accuracies against seconds since the run started.",
                               "wall time (s)", "test accuracy", accWall, "",
                               "no epoch line with test_accuracy"));
  plots.push_back(drawer.lines(
      "rank-throughput", "Samples per second of each rank",
      "Each rank's own pace: its samples over its data and compute time (waiting and exposed "
      "communication left out), so a slow rank stands out below the others.",
      "step", "samples/s", rankRates, "set yrange [0:*]\n",
      "no interval lines (fit writes them every FitOptions::metricsEvery steps)"));

  // Step-time breakdown: per run and rank, the mean of the interval lines.
  std::vector<std::pair<std::string, std::vector<double>>> breakdown;
  std::map<std::string, std::pair<double, double>> byAlgorithm;  // bytes, seconds
  for (const Run& run : runs) {
    // rank -> data, compute alone, compute overlapped with communication, exposed, wait, count
    std::map<int, std::vector<double>> sums;
    for (const nlohmann::json& line : run.intervals) {
      if (line.contains("ranks")) {
        for (const nlohmann::json& r : line["ranks"]) {
          std::vector<double>& s = sums[intField(r, "rank", 0)];
          s.resize(6, 0.0);
          // Communication that neither shows as exposed nor as waiting ran during compute.
          const double compute = field(r, "compute_s");
          const double hidden = std::clamp(
              field(r, "comm_s") - field(r, "exposed_comm_s") - field(r, "wait_s"), 0.0, compute);
          s[0] += field(r, "data_s");
          s[1] += compute - hidden;
          s[2] += hidden;
          s[3] += field(r, "exposed_comm_s");
          s[4] += field(r, "wait_s");
          s[5] += 1;
        }
      }
      const double bytes = field(line, "comm_bytes");
      const double gbps = field(line, "comm_gbps");
      if (bytes > 0 && gbps > 0) {
        auto& a = byAlgorithm[run.startField("algorithm", textField(line, "algorithm", "auto")) + " (" +
                              run.startField("ranks", "?") + " ranks)"];
        a.first += bytes;
        a.second += bytes / (gbps * 1e9);
      }
    }
    for (auto& [rank, s] : sums) {
      std::vector<double> ms;
      for (int i = 0; i < 5; ++i) ms.push_back(1e3 * s[i] / s[5]);
      breakdown.emplace_back(run.name + " r" + std::to_string(rank), ms);
    }
  }
  plots.push_back(drawer.bars(
      "step-breakdown", "Step-time breakdown per rank",
      "Mean milliseconds per step: waiting for data, compute (forward, backward, optimizer) "
      "alone and while all-reduces ran beside it, communication that backward did not hide, "
      "and waiting for the slowest rank.",
      "ms per step",
      {"data", "compute", "compute, communication overlapped", "exposed communication", "waiting"},
      breakdown, true,
      "no interval lines"));
  if (!timelineSteps.empty()) {
    plots.push_back(drawer.bars(
        "timeline-breakdown", "Step-time breakdown per rank, from the timeline",
        "Mean milliseconds per step span of the timeline: data spans, compute spans (forward, "
        "backward, optimizer), communication the stepping thread waited for (gradient sync, "
        "blocking collectives) and the rest of the step.",
        "ms per step", {"data", "compute", "exposed communication", "other"}, timelineSteps, true,
        "no step spans in the timeline"));
    plots.push_back(drawer.bars(
        "timeline-comm", "Communication per rank, from the timeline",
        "Mean milliseconds per step during which any thread of the rank communicated (the union "
        "of its comm spans), against the part its stepping thread waited for.",
        "ms per step", {"communication (any thread)", "exposed communication"}, timelineComm, false,
        "no step spans in the timeline"));
  }
  std::vector<std::pair<std::string, std::vector<double>>> volume, bandwidth;
  for (const auto& [algorithm, a] : byAlgorithm) {
    volume.emplace_back(algorithm, std::vector<double>{a.first / 1e9});
    bandwidth.emplace_back(algorithm, std::vector<double>{a.second > 0 ? a.first / a.second / 1e9 : 0.0});
  }
  plots.push_back(drawer.bars("comm-volume", "Communication volume per algorithm",
                              "Gradient bytes each rank all-reduced over the run, by all-reduce "
                              "algorithm and rank count.",
                              "GB per rank", {"all-reduce volume"}, volume, false,
                              "no communication (one process)"));
  plots.push_back(drawer.bars("comm-bandwidth", "All-reduce bandwidth per algorithm",
                              "Bytes all-reduced over the seconds the all-reduces took, less the "
                              "time spent waiting for a slower rank (algbw), "
                              "by algorithm and rank count.",
                              "GB/s", {"algbw"}, bandwidth, false, "no communication (one process)"));

  // Membership and fault events on a time line: one row per run.
  std::ostringstream events;
  std::vector<Series> eventSeries;
  std::map<std::string, Series> byName;
  std::string ytics;
  for (size_t i = 0; i < runs.size(); ++i) {
    ytics += (i ? ", " : "") + quoted(runs[i].name) + " " + std::to_string(i);
    for (const nlohmann::json& e : runs[i].events) {
      Series& s = byName[e.value("event", "?")];
      s.title = e.value("event", "?");
      s.points.emplace_back(field(e, "wall_s"), static_cast<double>(i));
    }
  }
  for (auto& [name, s] : byName) eventSeries.push_back(std::move(s));
  plots.push_back(drawer.lines(
      "events", "Membership and fault events",
      "When each run started or resumed (with its rank count), wrote checkpoints, failed and "
      "ended.",
      "wall time (s)", "", eventSeries,
      "set ytics (" + ytics + ")\nset yrange [-0.5:" + std::to_string(runs.size() - 0.5) +
          "]\n",
      "no event lines", "points pt 7 ps 1.5"));
  return plots;
}

}  // namespace kolo::cli::report
