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

/// `text` with &, <, >, " and ' escaped for HTML.
std::string escapeHtml(const std::string& text);

}  // namespace kolo::cli::report
