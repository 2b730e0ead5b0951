// The records a training loop leaves, written once for every loop of the train layer (fit's
// and the parameter-server chief's): the metrics file's events, epoch lines and final line
// (docs/training.md's schema), and the progress line's text.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "kolo/observe.h"
#include "kolo/train/fit.h"

namespace kolo::train::detail {

/// The run's metrics lines (rank 0 with a path; nothing otherwise). Not thread-safe.
class MetricsLog {
 public:
  /// Opens `path` ("" : no file), continuing it when `append` (a resumed run); wall times
  /// count from `start`.
  MetricsLog(const std::string& path, bool append, std::chrono::steady_clock::time_point start);
  /// Opens `path` when no file is open yet ("" : nothing): an elastic job's new rank 0
  /// takes the file over (appending).
  void open(const std::string& path, bool append);
  observe::MetricsWriter* writer() { return writer_.get(); }
  void write(const observe::Fields& fields);
  /// An event for `kolo report`: "start", "resume", "checkpoint", "end" or "failed" at step
  /// `at`, with `extra` fields.
  void event(const char* name, int64_t at, const observe::Fields& extra = {});
  double wallSeconds() const;

 private:
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<observe::MetricsWriter> writer_;
};

/// Writes a "failed" event at the step `step` points to when it is destroyed by an exception
/// leaving the loop that holds it (nothing on a normal exit).
class FailureEvent {
 public:
  FailureEvent(MetricsLog& metrics, const int64_t& step) : metrics_(metrics), step_(step) {}
  ~FailureEvent();
  FailureEvent(const FailureEvent&) = delete;
  FailureEvent& operator=(const FailureEvent&) = delete;

 private:
  MetricsLog& metrics_;
  const int64_t& step_;
  int uncaught_ = std::uncaught_exceptions();
};

/// "1.2k" above a thousand samples per second, "850" below.
std::string formatRate(double samplesPerSecond);

/// The progress line's text at an epoch's end: "loss L  test accuracy A  R samples/s" (no
/// accuracy without a validation set).
std::string epochProgressText(double trainLoss, const std::optional<EvaluateResult>& validation,
                              double samplesPerSecond);

/// An epoch's metrics line: epoch, step, train_loss, test_accuracy (with a validation set),
/// samples_per_s, wall_s, lr.
observe::Fields epochFields(const EpochEnd& epoch, double wallSeconds, double lr);

/// The final metrics line: epoch, step, train_loss, test_accuracy (with a validation set),
/// samples_per_s, steady_samples_per_s, grad_bytes_per_step, wall_s; the caller adds its
/// own fields and then "final": true.
observe::Fields finalFields(const FitSummary& summary, bool validation);

}  // namespace kolo::train::detail
