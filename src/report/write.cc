// writeReport: the page (html.cc) and the plots (plots.cc) of `kolo report` in a directory.
#include <filesystem>
#include <fstream>

#include "kolo/error.h"
#include "report/html.h"

namespace kolo::cli::report {

WrittenReport writeReport(const std::vector<Run>& runs, const std::string& out) {
  std::error_code error;
  std::filesystem::create_directories(out, error);
  if (error) KOLO_THROW(IoError, "kolo report: cannot create ", out, ": ", error.message());
  const std::vector<Plot> plots = drawPlots(runs, out);
  WrittenReport written{.page = (std::filesystem::path(out) / "index.html").string(), .plots = plots.size()};
  std::ofstream html(written.page);
  html << renderHtml(runs, plots);
  html.close();
  if (!html) KOLO_THROW(IoError, "kolo report: cannot write ", written.page);
  for (const Plot& plot : plots) written.drawn += plot.svg.empty() ? 0 : 1;
  return written;
}

}  // namespace kolo::cli::report
