// renderHtml: the report page, built as text; failureLines names the ranks that failed.
#include "report/html.h"

#include <cstdio>
#include <map>
#include <sstream>

namespace kolo::cli::report {
namespace {

const char* kStyle = R"(
body { font-family: 'DejaVu Sans', sans-serif; margin: 24px; color: #222; max-width: 1640px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; margin: 4px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid #e4e4e4; padding: 8px; }
figure svg { width: 100%; height: auto; }
figcaption { font-size: 12px; color: #555; }
figure.empty p { color: #888; font-style: italic; }
)";

std::string fixed(const nlohmann::json* record, const char* key, const char* format) {
  if (!record || !record->contains(key) || !(*record)[key].is_number()) return "";
  char text[48];
  std::snprintf(text, sizeof text, format, (*record)[key].get<double>());
  return text;
}

// The rank named slowest most often in a run's interval lines.
std::string slowestRank(const Run& run) {
  std::map<int, int> counts;
  for (const nlohmann::json& line : run.intervals)
    if (line.contains("ranks") && line["ranks"].size() > 1 && intField(line, "slowest_rank", -1) >= 0)
      ++counts[intField(line, "slowest_rank", -1)];
  int best = -1, most = 0;
  for (const auto& [rank, count] : counts)
    if (count > most) best = rank, most = count;
  return best < 0 ? "" : std::to_string(best) + " (" + std::to_string(most) + " of " +
                             std::to_string(run.intervals.size()) + " intervals)";
}

}  // namespace

std::string escapeHtml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string renderHtml(const std::vector<Run>& runs, const std::vector<Plot>& plots) {
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\" />\n"
       << "<title>kolo report: ";
  for (size_t i = 0; i < runs.size(); ++i) html << (i ? ", " : "") << escapeHtml(runs[i].name);
  html << "</title>\n<link rel=\"icon\" href=\"data:,\" />\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
       << "<h1>kolo report</h1>\n";

  html << "<h2 id=\"summary\">Summary</h2>\n<table id=\"summary-table\">\n<tr><th class=\"text\">run</th>"
          "<th class=\"text\">strategy</th><th>ranks</th><th class=\"text\">algorithm</th>"
          "<th>batch</th><th>steps</th><th>epochs</th><th>train loss</th><th>test accuracy</th>"
          "<th>samples/s</th><th>steady samples/s</th><th>wall s</th><th>checkpoints</th>"
          "<th class=\"text\">slowest rank</th><th class=\"text\">status</th></tr>\n";
  for (const Run& run : runs) {
    const nlohmann::json* last = run.final ? &*run.final : (run.epochs.empty() ? nullptr : &run.epochs.back());
    bool failed = false, ended = run.final.has_value();
    for (const nlohmann::json& e : run.events) failed = failed || e.value("event", "") == "failed";
    html << "<tr><td class=\"text\">" << escapeHtml(run.name) << "</td><td class=\"text\">"
         << escapeHtml(run.startField("strategy", "")) << "</td><td>"
         << escapeHtml(run.startField("ranks", "")) << "</td><td class=\"text\">"
         << escapeHtml(run.startField("algorithm", "")) << "</td><td>"
         << escapeHtml(run.startField("batch", "")) << "</td><td>" << fixed(last, "step", "%.0f")
         << "</td><td>" << fixed(last, "epoch", "%.0f") << "</td><td>"
         << fixed(last, "train_loss", "%.4f") << "</td><td>" << fixed(last, "test_accuracy", "%.4f")
         << "</td><td>" << fixed(last, "samples_per_s", "%.0f") << "</td><td>"
         << fixed(run.final ? &*run.final : nullptr, "steady_samples_per_s", "%.0f") << "</td><td>"
         << fixed(last, "wall_s", "%.1f") << "</td><td>" << run.checkpoints.size()
         << "</td><td class=\"text\">" << slowestRank(run) << "</td><td class=\"text\">"
         << (failed ? "failed" : ended ? "finished" : "running or stopped") << "</td></tr>\n";
  }
  html << "</table>\n";

  html << "<h2 id=\"plots\">Plots</h2>\n<div class=\"plots\">\n";
  for (const Plot& plot : plots) {
    html << "<figure id=\"plot-" << plot.id << "\"" << (plot.svg.empty() ? " class=\"empty\"" : "")
         << ">\n<h3>" << escapeHtml(plot.title) << "</h3>\n";
    if (plot.svg.empty()) {
      html << "<p>" << escapeHtml(plot.empty) << "</p>\n";
    } else {
      html << plot.svg << "\n";
    }
    html << "<figcaption>" << escapeHtml(plot.caption) << " (<a href=\"" << plot.id
         << ".svg\">" << plot.id << ".svg</a>)</figcaption>\n</figure>\n";
  }
  html << "</div>\n";

  html << "<h2 id=\"events\">Events</h2>\n<table id=\"events-table\">\n<tr><th class=\"text\">run</th>"
          "<th class=\"text\">event</th><th>step</th><th>wall s</th><th class=\"text\">details</th></tr>\n";
  for (const Run& run : runs) {
    for (const nlohmann::json& e : run.events) {
      std::string details;
      for (const auto& [key, value] : e.items()) {
        if (key == "kind" || key == "event" || key == "step" || key == "wall_s") continue;
        details += (details.empty() ? "" : ", ") + key + " " +
                   (value.is_string() ? value.get<std::string>() : value.dump());
      }
      html << "<tr><td class=\"text\">" << escapeHtml(run.name) << "</td><td class=\"text\">"
           << escapeHtml(e.value("event", "")) << "</td><td>" << fixed(&e, "step", "%.0f")
           << "</td><td>" << fixed(&e, "wall_s", "%.2f") << "</td><td class=\"text\">"
           << escapeHtml(details) << "</td></tr>\n";
    }
  }
  html << "</table>\n";

  html << "<h2 id=\"files\">Files</h2>\n<ul>\n";
  for (const Run& run : runs) {
    html << "<li>" << escapeHtml(run.name) << ": metrics";
    for (const std::string& f : run.metricsFiles) html << " <code>" << escapeHtml(f) << "</code>";
    if (!run.checkpoints.empty()) {
      html << "; checkpoints at steps";
      for (const auto& [step, path] : run.checkpoints) html << " " << step;
    }
    for (const std::string& t : run.traces)
      html << "; timeline <code>" << escapeHtml(t) << "</code> (open it in Perfetto)";
    html << "</li>\n";
  }
  html << "</ul>\n</body>\n</html>\n";
  return html.str();
}

std::vector<std::string> failureLines(const std::vector<Run>& runs) {
  std::vector<std::string> lines;
  for (const Run& run : runs)
    for (const nlohmann::json& e : run.events) {
      if (e.value("event", "") != "failed" || !e.contains("rank")) continue;
      const std::string how = e.contains("signal")        ? textField(e, "signal")
                              : e.contains("exit_status") ? "exit status " + e["exit_status"].dump()
                                                          : "";
      char at[32];
      std::snprintf(at, sizeof at, "%.1f", numberField(e, "wall_s", 0.0));
      lines.push_back(run.name + ": rank " + e["rank"].dump() + " failed: " + how + " (" + textField(e, "cause") +
                      ") at " + at + " s");
    }
  return lines;
}

}  // namespace kolo::cli::report
