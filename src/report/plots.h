// The plots of `kolo report`, drawn by gnuplot (Debian's gnuplot-nox, SVG terminal): each
// plot is a gnuplot script with its data inline (kept next to the SVG, so a plot can be
// redrawn or restyled by hand) that kolo runs once.
#pragma once

#include <string>
#include <vector>

#include "report/runs.h"

namespace kolo::cli::report {

/// One figure of the report.
struct Plot {
  std::string id;       // "loss-step": the file names (id.svg, plots/id.gp) and the HTML id
  std::string title;    // "Training loss against step"
  std::string caption;  // what it shows, one sentence
  std::string svg;      // the drawing (empty when there was no data)
  std::string empty;    // why there is no drawing ("no interval lines: ...")
};

/// Draws every plot of `runs` into `outDir` (id.svg and plots/id.gp). Throws IoError when
/// gnuplot cannot be started (naming the package to install) or fails (naming the script
/// and gnuplot's message).
std::vector<Plot> drawPlots(const std::vector<Run>& runs, const std::string& outDir);

}  // namespace kolo::cli::report
