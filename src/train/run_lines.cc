// The records of a training loop (run_lines.h).
#include "train/run_lines.h"

#include <cstdio>

namespace kolo::train::detail {
namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append,
                       std::chrono::steady_clock::time_point start)
    : start_(start) {
  open(path, append);
}

void MetricsLog::open(const std::string& path, bool append) {
  if (!path.empty() && !writer_) writer_ = std::make_unique<observe::MetricsWriter>(path, append);
}

void MetricsLog::write(const observe::Fields& fields) {
  if (writer_) writer_->write(fields);
}

void MetricsLog::event(const char* name, int64_t at, const observe::Fields& extra) {
  if (!writer_) return;
  observe::Fields fields{{"kind", "event"}, {"event", name}, {"step", at},
                         {"wall_s", secondsSince(start_)}};
  writer_->write(fields.update(extra));
}

double MetricsLog::wallSeconds() const { return secondsSince(start_); }

FailureEvent::~FailureEvent() {
  if (std::uncaught_exceptions() <= uncaught_) return;
  try {
    metrics_.event("failed", step_);
  } catch (const std::exception&) {
    // The exception already leaving is the one to report.
  }
}

std::string formatRate(double samplesPerSecond) {
  char text[32];
  if (samplesPerSecond >= 1000) {
    std::snprintf(text, sizeof(text), "%.1fk", samplesPerSecond / 1000);
  } else {
    std::snprintf(text, sizeof(text), "%.0f", samplesPerSecond);
  }
  return text;
}

std::string epochProgressText(double trainLoss, const std::optional<EvaluateResult>& validation,
                              double samplesPerSecond) {
  char text[128];
  if (validation)
    std::snprintf(text, sizeof(text), "loss %.4f  test accuracy %.4f  %s samples/s", trainLoss,
                  validation->accuracy, formatRate(samplesPerSecond).c_str());
  else
    std::snprintf(text, sizeof(text), "loss %.4f  %s samples/s", trainLoss,
                  formatRate(samplesPerSecond).c_str());
  return text;
}

observe::Fields epochFields(const EpochEnd& epoch, double wallSeconds, double lr) {
  observe::Fields line{{"epoch", epoch.epoch}, {"step", epoch.step}, {"train_loss", epoch.trainLoss}};
  if (epoch.validation) line.update({{"test_accuracy", epoch.validation->accuracy}, {"test_loss", epoch.validation->loss}});
  line.update({{"samples_per_s", epoch.samplesPerSecond}, {"wall_s", wallSeconds}, {"lr", lr}});
  return line;
}

observe::Fields finalFields(const FitSummary& summary, bool validation) {
  observe::Fields last{{"epoch", summary.epochs}, {"step", summary.steps},
                       {"train_loss", summary.trainLoss}};
  if (validation) last.update({{"test_accuracy", summary.validationAccuracy}, {"test_loss", summary.validationLoss}});
  last.update({{"samples_per_s", summary.samplesPerSecond},
               {"steady_samples_per_s", summary.steadySamplesPerSecond},
               {"grad_bytes_per_step", summary.gradBytesPerStep},
               {"wall_s", summary.wallSeconds}});
  return last;
}

}  // namespace kolo::train::detail
