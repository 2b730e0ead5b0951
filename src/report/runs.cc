// Reading a run directory for `kolo report`.
#include "report/runs.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kolo/checkpoint.h"
#include "kolo/error.h"

namespace kolo::cli::report {
namespace {

namespace fs = std::filesystem;

void readMetrics(const fs::path& path, Run& run) {
  std::ifstream in(path);
  if (!in) KOLO_THROW(FileError, "kolo report: cannot read ", path.string());
  readMetricsLines(in, path.string(), run);
}

void findCheckpoints(const fs::path& dir, Run& run, int depth) {
  std::error_code error;
  checkpoint::CheckpointManager manager(dir.string(), 1 << 30, false, [](const std::string&) {});
  for (const checkpoint::CheckpointInfo& info : manager.list())
    run.checkpoints.emplace_back(info.step, info.path);
  if (depth == 0) return;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("ckpt-", 0) != 0 && name[0] != '.')
      findCheckpoints(entry.path(), run, depth - 1);
  }
}

bool isTrace(const fs::path& path) {
  std::ifstream in(path);
  char head[4096] = {};
  in.read(head, sizeof head - 1);
  return std::string(head).find("\"traceEvents\"") != std::string::npos;
}

}  // namespace

Run readRun(const std::string& dir) {
  const fs::path path(dir);
  std::error_code error;
  if (!fs::is_directory(path, error))
    KOLO_THROW(FileError, "kolo report: ", dir, " is not a directory (give the directory of a "
               "run's metrics file, FitOptions::metricsPath)");
  Run run;
  run.dir = dir;
  run.name = fs::absolute(path).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::absolute(path).lexically_normal().parent_path().filename().string();
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, error))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    if (file.extension() == ".jsonl") {
      run.metricsFiles.push_back(file.string());
      readMetrics(file, run);
    } else if (file.extension() == ".json" && isTrace(file)) {
      run.traces.push_back(file.string());
    }
  }
  if (run.metricsFiles.empty())
    KOLO_THROW(FileError, "kolo report: ", dir, " holds no metrics file (*.jsonl, written by "
               "fit at FitOptions::metricsPath)");
  findCheckpoints(path, run, 2);
  std::sort(run.checkpoints.begin(), run.checkpoints.end());
  return run;
}

}  // namespace kolo::cli::report
