// The files `kolo report` and the launcher's observers read back, as the first byte says:
// 0, a Chrome trace for the step-time breakdown (src/report/timeline.cc); 1, a rank's
// flight-recorder dump, loaded and diagnosed (src/observe/hang_report.cc); 2, a rank's
// trace merged into trace.json (src/observe/timeline_merge.cc); 3, a metrics file, read
// (src/report/metrics_lines.cc) and rendered as the report's page (src/report/html.cc). The
// rest is the file, written into a scratch directory of this process.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fuzz_check.h"
#include "kolo/error.h"
#include "kolo/hang_report.h"
#include "kolo/timeline.h"
#include "report/html.h"
#include "report/runs.h"
#include "report/timeline.h"

using namespace kolo;
namespace fs = std::filesystem;

namespace {

/// This process's scratch directory, removed at exit.
struct Scratch {
  fs::path dir;
  Scratch() {
    std::string name = (fs::temp_directory_path() / "kolo-report-fuzz-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) std::abort();
    dir = name;
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

fs::path writeFile(const Scratch& scratch, const std::string& name, const std::string& bytes) {
  for (const auto& entry : fs::directory_iterator(scratch.dir)) fs::remove(entry.path());
  const fs::path path = scratch.dir / name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Scratch scratch;
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0: {
        const fs::path file = writeFile(scratch, "trace.json", bytes);
        for (const cli::report::RankTimeline& r : cli::report::timelineBreakdown({file.string()}))
          KOLO_FUZZ_REQUIRE(r.steps > 0);
        break;
      }
      case 1: {
        writeFile(scratch, "flight.rank0.json", bytes);
        const auto dumps = observe::loadFlightDumps(scratch.dir.string());
        KOLO_FUZZ_REQUIRE(dumps.size() == 1);
        observe::diagnoseHang(dumps);
        break;
      }
      case 2: {
        writeFile(scratch, "trace.rank0.json", bytes);
        const observe::MergedTimeline merged = observe::mergeTimeline(scratch.dir.string());
        KOLO_FUZZ_REQUIRE(merged.ranks.size() == 1 && merged.ranks[0] == 0);
        break;
      }
      default: {
        cli::report::Run run;
        run.name = "fuzz";
        std::istringstream in(bytes);
        cli::report::readMetricsLines(in, "metrics.jsonl", run);
        cli::report::renderHtml({run}, {});
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
