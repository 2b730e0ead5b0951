// StepMonitor (the ranks' step-time breakdown, exchanged every interval), RankFiguresLog
// (each rank's step times and memory peaks over a fit, gathered at its end) and RankStatus
// (each rank's step and state in a file that another terminal reads).
#include "train/monitor.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/printf_text.h"
#include "kolo/error.h"
#include "kolo/settings.h"
#include "observe/rank_files.h"

namespace kolo::train::detail {
namespace {

enum Sum { kSteps, kData, kStep, kComm, kExposed, kBytes, kSums };

double seconds(parallel::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string millis(double s) {
  char text[32];
  std::snprintf(text, sizeof text, s < 0.01 ? "%.2f" : "%.1f", s * 1e3);
  return text;
}

}  // namespace

StepMonitor::StepMonitor(comm::Communicator* comm, int64_t every, int64_t localBatch)
    : comm_(comm), every_(std::max<int64_t>(every, 1)), localBatch_(localBatch) {}

void StepMonitor::record(double dataSeconds, double stepSeconds, const parallel::Reducer* reducer,
                         double blockedSeconds) {
  sums_[kSteps] += 1;
  sums_[kData] += dataSeconds;
  sums_[kStep] += stepSeconds;
  if (!reducer) {
    // fsdp's gathers, a pipeline's messages, tensor parallelism's all-reduces: all exposed.
    sums_[kComm] += blockedSeconds;
    sums_[kExposed] += std::min(blockedSeconds, stepSeconds);
    return;
  }
  const parallel::StepTimeline& t = reducer->timeline();
  double comm = 0.0, bytes = 0.0;
  for (size_t b = 0; b < t.bucketStart.size() && b < t.bucketFinish.size(); ++b) {
    if (t.bucketStart[b] == parallel::Clock::time_point() || t.bucketFinish[b] < t.bucketStart[b])
      continue;
    comm += seconds(t.bucketFinish[b] - t.bucketStart[b]);
  }
  for (size_t b = 0; b < reducer->bucketCount(); ++b) bytes += static_cast<double>(reducer->bucketBytes(b));
  // finalize() (or the sharded update) is what backward did not hide.
  const double exposed = t.finalizeEnd > t.finalizeStart ? seconds(t.finalizeEnd - t.finalizeStart) : 0.0;
  // The sharded update exchanges through shared memory without buckets: its time is the
  // update's communication.
  sums_[kComm] += comm > 0.0 ? comm : exposed;
  sums_[kExposed] += std::min(exposed, stepSeconds);
  sums_[kBytes] += bytes;
}

std::optional<IntervalTimes> StepMonitor::endOfStep(int64_t stepsDone) {
  if (stepsDone % every_ != 0) return std::nullopt;
  const int size = comm_ ? comm_->size() : 1;
  std::vector<double> all(static_cast<size_t>(kSums) * size);
  if (comm_ && size > 1) {
    comm_->allgather(sums_, all.data(), kSums, DType::F64);
  } else {
    std::copy(sums_, sums_ + kSums, all.begin());
  }
  std::fill(sums_, sums_ + kSums, 0.0);

  IntervalTimes interval;
  interval.step = stepsDone;
  double slowestBusy = -1.0;
  for (int r = 0; r < size; ++r) {
    const double* s = &all[static_cast<size_t>(r) * kSums];
    RankTimes t;
    t.rank = r;
    t.steps = static_cast<int64_t>(s[kSteps]);
    const double n = std::max(s[kSteps], 1.0);
    t.data = s[kData] / n;
    t.step = s[kStep] / n;
    t.comm = s[kComm] / n;
    t.exposed = s[kExposed] / n;
    t.compute = std::max(t.step - t.data - t.exposed, 0.0);
    t.commBytes = s[kBytes] / n;
    const double busy = t.data + t.compute;
    t.samplesPerSecond = busy > 0 ? localBatch_ / busy : 0.0;
    if (busy > slowestBusy) {
      slowestBusy = busy;
      interval.slowest = r;
    }
    interval.ranks.push_back(t);
  }
  // A rank that arrives at the all-reduce before the slowest waits for it inside its
  // exposed communication time.
  for (RankTimes& t : interval.ranks) {
    t.wait = std::clamp(slowestBusy - (t.data + t.compute), 0.0, t.exposed);
    t.exposed -= t.wait;
  }
  return interval;
}

observe::Fields IntervalTimes::fields(const std::string& algorithm) const {
  RankTimes mean;
  double commSeconds = 0.0, bytes = 0.0;
  observe::Value::Array perRank;
  for (const RankTimes& t : ranks) {
    mean.data += t.data / ranks.size();
    mean.compute += t.compute / ranks.size();
    mean.comm += t.comm / ranks.size();
    mean.exposed += t.exposed / ranks.size();
    mean.wait += t.wait / ranks.size();
    mean.step += t.step / ranks.size();
    // Time spent waiting for a slower rank moves no bytes: it is not the link's.
    commSeconds += std::max(t.comm - t.wait, 0.0) * t.steps;
    bytes += t.commBytes * t.steps;
    perRank.push_back(observe::Fields{{"rank", t.rank},
                                      {"samples_per_s", t.samplesPerSecond},
                                      {"data_s", t.data},
                                      {"compute_s", t.compute},
                                      {"comm_s", t.comm},
                                      {"exposed_comm_s", t.exposed},
                                      {"wait_s", t.wait},
                                      {"step_s", t.step}});
  }
  observe::Fields fields{{"kind", "interval"},
                         {"step", step},
                         {"data_s", mean.data},
                         {"compute_s", mean.compute},
                         {"comm_s", mean.comm},
                         {"exposed_comm_s", mean.exposed},
                         {"wait_s", mean.wait},
                         {"step_s", mean.step},
                         {"slowest_rank", slowest}};
  if (bytes > 0) {
    // Bytes every rank all-reduced over the seconds its all-reduces took, less waiting
    // (algbw).
    fields.set("comm_bytes", bytes / ranks.size());
    fields.set("comm_gbps", commSeconds > 0 ? bytes / commSeconds / 1e9 : 0.0);
    fields.set("algorithm", algorithm);
  }
  fields.set("ranks", perRank);
  return fields;
}

std::string IntervalTimes::progressText() const {
  if (ranks.empty()) return "";
  const RankTimes& t = ranks.front();  // rank 0's view: its own wait is the others' lead
  std::string text = "step " + millis(t.step) + " ms: data " + millis(t.data) + " compute " +
                     millis(t.compute);
  if (t.comm > 0) text += " comm " + millis(t.comm) + " exposed " + millis(t.exposed);
  if (ranks.size() > 1) {
    text += " wait " + millis(t.wait) + ", slowest rank " + std::to_string(slowest) + " (" +
            millis(ranks[static_cast<size_t>(slowest)].data + ranks[static_cast<size_t>(slowest)].compute) +
            " ms busy)";
  }
  return text;
}

std::string statusFileOf(const std::string& optionsStatusFile) {
  // A program of one's own under `kolo run --status-file` keeps its lines without a word.
  return optionsStatusFile.empty() ? settings::statusFile() : optionsStatusFile;
}

RankStatus::RankStatus(std::string file, int rank, int64_t totalSteps)
    : path_(file.empty() ? "" : file + ".rank-" + std::to_string(rank)),
      rank_(rank),
      totalSteps_(totalSteps),
      uncaught_(std::uncaught_exceptions()) {
  if (!path_.empty()) update("starting", 0);
}

RankStatus::~RankStatus() {
  if (path_.empty()) return;
  try {
    write(std::uncaught_exceptions() > uncaught_ ? "failed" : "done");
  } catch (const std::exception&) {
    // A destructor reports nothing: the run's own error (or success) is what counts.
  }
}

void RankStatus::update(const std::string& state, int64_t step, double loss, double stepSeconds,
                        double samplesPerSecond) {
  if (path_.empty()) return;
  step_ = step;
  if (loss != 0.0) loss_ = loss;
  if (stepSeconds > 0.0) stepSeconds_ = stepSeconds;
  if (samplesPerSecond > 0.0) samplesPerSecond_ = samplesPerSecond;
  const auto now = std::chrono::steady_clock::now();
  if (state == state_ && now - lastWrite_ < std::chrono::milliseconds(500)) return;
  lastWrite_ = now;
  write(state);
}

void RankStatus::write(const std::string& state) {
  state_ = state;
  const double unixSeconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line = observe::Fields{{"rank", rank_},
                                           {"pid", static_cast<int64_t>(::getpid())},
                                           {"state", state},
                                           {"step", step_},
                                           {"total_steps", totalSteps_},
                                           {"epoch", epoch_},
                                           {"loss", loss_},
                                           {"step_s", stepSeconds_},
                                           {"samples_per_s", samplesPerSecond_},
                                           {"updated", unixSeconds}}
                               .json() + "\n";
  // Readers see the old line or the new one, never half of one.
  const std::string temporary = path_ + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (!file) KOLO_THROW(IoError, "cannot write the status file ", temporary, ": ", std::strerror(errno));
  const bool written = std::fwrite(line.data(), 1, line.size(), file) == line.size();
  if (std::fclose(file) != 0 || !written || std::rename(temporary.c_str(), path_.c_str()) != 0)
    KOLO_THROW(IoError, "cannot write the status file ", path_, ": ", std::strerror(errno));
}

void RankFiguresLog::record(const StepFigures& figures, double stepSeconds, int64_t peakTensorBytes,
                            bool steady) {
  for (int i = 0; i < (steady ? 2 : 1); ++i) {
    compute_[i] += figures.computeSeconds;
    step_[i] += stepSeconds;
    ++steps_[i];
  }
  peaks_.peakStepBytes = std::max(peaks_.peakStepBytes, figures.peakStepBytes);
  peaks_.peakTensorBytes = std::max(peaks_.peakTensorBytes, peakTensorBytes - tensorBase_);
  peaks_.peakMicroBatchesHeld = std::max(peaks_.peakMicroBatchesHeld, figures.microBatchesHeld);
  peaks_.peakBoundaryBytes = std::max(peaks_.peakBoundaryBytes, figures.boundaryBytes);
}

std::vector<RankFigures> RankFiguresLog::gather(comm::Communicator* comm) const {
  const int which = steps_[1] > 0 ? 1 : 0;
  const double steps = static_cast<double>(std::max<int64_t>(steps_[which], 1));
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  constexpr size_t kFields = 7;
  const double mine[kFields] = {compute_[which] / steps,
                                step_[which] / steps,
                                static_cast<double>(peaks_.peakStepBytes),
                                static_cast<double>(peaks_.peakTensorBytes),
                                static_cast<double>(peaks_.peakMicroBatchesHeld),
                                static_cast<double>(peaks_.peakBoundaryBytes),
                                static_cast<double>(usage.ru_maxrss) * 1024.0};
  const int size = comm ? comm->size() : 1;
  std::vector<double> all(kFields * static_cast<size_t>(size));
  if (comm) comm->allgather(mine, all.data(), kFields, DType::F64);
  else std::copy(mine, mine + kFields, all.begin());
  std::vector<RankFigures> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const double* f = &all[static_cast<size_t>(r) * kFields];
    ranks[static_cast<size_t>(r)] = {.rank = r,
                                     .computeSeconds = f[0],
                                     .stepSeconds = f[1],
                                     .peakStepBytes = static_cast<int64_t>(f[2]),
                                     .peakTensorBytes = static_cast<int64_t>(f[3]),
                                     .peakMicroBatchesHeld = static_cast<int64_t>(f[4]),
                                     .peakBoundaryBytes = static_cast<int64_t>(f[5]),
                                     .peakResidentBytes = static_cast<int64_t>(f[6])};
  }
  return ranks;
}

}  // namespace kolo::train::detail

namespace kolo::train {

std::vector<RankStatusLine> readRankStatus(const std::string& file) {
  namespace fs = std::filesystem;
  const fs::path base(file);
  const fs::path dir = base.has_parent_path() ? base.parent_path() : fs::path(".");
  const std::string prefix = base.filename().string() + ".rank-";
  std::error_code error;
  fs::directory_iterator entries(dir, error);
  if (error) KOLO_THROW(FileError, "cannot read the directory ", dir.string(), " of status file ", file, ": ", error.message());
  std::vector<RankStatusLine> ranks;
  for (const fs::directory_entry& entry : entries) {
    const std::optional<int> rank = observe::detail::rankOfFile(entry.path().filename().string(), prefix, "");
    if (!rank) continue;
    std::ifstream in(entry.path());
    std::string text;
    std::getline(in, text);
    const nlohmann::json f = nlohmann::json::parse(text, nullptr, false);
    if (f.is_discarded() || !f.is_object())
      KOLO_THROW(FormatError, entry.path().string(), " is not a status line");
    RankStatusLine line{.rank = *rank,
                        .pid = f.value("pid", int64_t{0}),
                        .state = f.value("state", "?"),
                        .step = f.value("step", int64_t{0}),
                        .totalSteps = f.value("total_steps", int64_t{0}),
                        .epoch = f.value("epoch", int64_t{0}),
                        .loss = f.value("loss", 0.0),
                        .stepSeconds = f.value("step_s", 0.0),
                        .samplesPerSecond = f.value("samples_per_s", 0.0),
                        .updated = f.value("updated", 0.0)};
    line.gone = line.state != "done" && line.state != "failed" && line.pid > 0 &&
                ::kill(static_cast<pid_t>(line.pid), 0) != 0 && errno == ESRCH;
    ranks.push_back(std::move(line));
  }
  std::sort(ranks.begin(), ranks.end(), [](const RankStatusLine& a, const RankStatusLine& b) { return a.rank < b.rank; });
  return ranks;
}

Straggler findStraggler(const std::vector<RankStatusLine>& lines) {
  Straggler behind;
  int64_t slowest = -1;
  for (const RankStatusLine& line : lines) {
    if (line.state == "training" && !line.gone && (slowest < 0 || line.step < slowest)) {
      slowest = line.step;
      behind.rank = line.rank;
    }
    behind.furthestStep = std::max(behind.furthestStep, line.step);
  }
  behind.step = slowest;
  if (behind.rank < 0 || behind.furthestStep <= slowest) behind.rank = -1;
  return behind;
}

std::string rankStatusTable(const std::vector<RankStatusLine>& lines, double now) {
  std::string text = kolo::detail::printfText("%-5s %-8s %-13s %-13s %-6s %-8s %-9s %-10s %s\n", "rank", "pid", "state",
                                        "step", "epoch", "loss", "step_ms", "samples/s", "updated");
  for (const RankStatusLine& r : lines) {
    const std::string state = r.gone ? r.state + "(gone)" : r.state;
    const std::string step = std::to_string(r.step) + "/" + std::to_string(r.totalSteps);
    text += kolo::detail::printfText("%-5d %-8lld %-13s %-13s %-6lld %-8.4f %-9.2f %-10.0f %.1f s ago\n", r.rank,
                               static_cast<long long>(r.pid), state.c_str(), step.c_str(),
                               static_cast<long long>(r.epoch), r.loss, 1e3 * r.stepSeconds, r.samplesPerSecond,
                               now - (r.updated > 0 ? r.updated : now));
  }
  if (const Straggler behind = findStraggler(lines); behind.rank >= 0)
    text += kolo::detail::printfText("behind: rank %d (step %lld; the furthest rank is at step %lld)\n", behind.rank,
                               static_cast<long long>(behind.step), static_cast<long long>(behind.furthestStep));
  return text;
}

}  // namespace kolo::train
