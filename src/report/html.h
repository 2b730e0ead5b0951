// The page of `kolo report`: one self-contained HTML file (styles and SVG drawings inline,
// nothing fetched over the network) with a summary table of the runs, every plot, and the
// runs' events and checkpoints.
#pragma once

#include <string>
#include <vector>

#include "report/plots.h"
#include "report/runs.h"

namespace kolo::cli::report {

/// The whole page.
std::string renderHtml(const std::vector<Run>& runs, const std::vector<Plot>& plots);

/// What writeReport wrote: the page and how many of the plots were drawn.
struct WrittenReport {
  std::string page;  // OUT/index.html
  int drawn = 0;
  size_t plots = 0;
};

/// Writes the page, OUT/index.html, and the plots, OUT/<plot>.svg, of `runs` (creating OUT).
/// Throws IoError naming what could not be written.
WrittenReport writeReport(const std::vector<Run>& runs, const std::string& out);

/// One line per failed rank among the runs' events: "RUN: rank R failed: HOW (CAUSE) at T s",
/// HOW the signal or the exit status.
std::vector<std::string> failureLines(const std::vector<Run>& runs);

/// `text` with &, <, >, " and ' escaped for HTML.
std::string escapeHtml(const std::string& text);

}  // namespace kolo::cli::report
