// fit's metrics and progress (fit_records.h).
#include "train/fit_records.h"

#include <algorithm>
#include <cstdio>

#include "kolo/memory.h"
#include "kolo/settings.h"

namespace kolo::train::detail {
namespace {

double secondsSince(FitRecords::Clock::time_point start) {
  return std::chrono::duration<double>(FitRecords::Clock::now() - start).count();
}

}  // namespace

FitRecords::FitRecords(const FitOptions& options, const FitPlan& plan, Engine& engine,
                       Clock::time_point start, int64_t firstStep, bool primary, int rank,
                       observe::Logger& logger)
    : options_(options),
      plan_(plan),
      engine_(engine),
      start_(start),
      logger_(logger),
      // A resumed run continues the metrics file (and its step count).
      metrics_(primary ? options.metricsPath : "", firstStep > 0, start),
      status_(statusFileOf(options.statusFile), rank, plan.totalSteps),
      rankFigures_(engine.tensorBytesBefore()),
      primary_(primary),
      rank_(rank),
      firstStep_(firstStep) {}

double FitRecords::wallSeconds() const { return secondsSince(start_); }

void FitRecords::setMembership(std::shared_ptr<comm::Communicator> comm, bool primary, int ranksLoading) {
  comm_ = std::move(comm);
  monitor_ = std::make_unique<StepMonitor>(comm_.get(), options_.metricsEvery,
                                           options_.batch / std::max(1, ranksLoading));
  // An elastic job's new rank 0 takes the file over (appending; nothing when it is open).
  if (primary) metrics_.open(options_.metricsPath, true);
  primary_ = primary;
}

void FitRecords::announce(int64_t step, const observe::Fields& extra) {
  metrics_.event(step > 0 ? "resume" : "start", step,
                 observe::Fields{{"ranks", comm_ ? comm_->size() : 1},
                                 {"replicas", engine_.replicas()},
                                 {"strategy", engine_.name()},
                                 {"algorithm", engine_.algorithm()},
                                 {"batch", options_.batch}}
                     .update(extra));
  if (!primary_) return;
  observe::Fields fields = options_.describe;
  fields.update({{"batch", options_.batch},
                 {"epochs", plan_.epochs},
                 {"steps", plan_.totalSteps},
                 {"first_step", step},
                 {"strategy", engine_.name()},
                 {"replicas", engine_.replicas()}});
  fields.update(engine_.describe());
  fields.set("loader", options_.prefetch > 0 ? "thread" : "inline");
  logger_.info("training", fields);
}

void FitRecords::beginEpoch(const data::LoaderState& at, int64_t steps) {
  passStart_ = at;
  status_.setEpoch(at.epoch + 1);
  bar_ = std::make_unique<observe::ProgressBar>(
      "epoch " + std::to_string(at.epoch + 1) + "/" + std::to_string(plan_.epochs), at.batch + steps,
      stderr, 100, options_.progress);
}

void FitRecords::recordStep(const StepFigures& figures, double seconds, int64_t peakBytes,
                            int64_t stateBytes, double dataSeconds, double blockedSeconds) {
  rankFigures_.record(figures, seconds, peakBytes, steady());
  stepPeakBytes_ = std::max(stepPeakBytes_, peakBytes);
  stateBytes_ = stateBytes;
  monitor_->record(dataSeconds, seconds, engine_.reducer(), blockedSeconds);
}

void FitRecords::stepDone(int64_t stepsDone, double loss, double seconds) {
  epochSeconds_ += seconds;
  if (steady()) {
    steadySeconds_ += seconds;
    ++steadySteps_;
  }
  lossSum_ += loss;
  ++lossCount_;
  intervalLoss_ += loss;
  ++intervalSteps_;
  status_.update("training", stepsDone, loss, seconds, options_.batch / std::max(seconds, 1e-9));
}

void FitRecords::writeInterval(const IntervalTimes& interval, const observe::Fields& extra) {
  breakdown_ = "  " + interval.progressText();
  if (metrics_.writer()) {
    observe::Fields fields = interval.fields(engine_.algorithm());
    fields.set("wall_s", wallSeconds());
    fields.set("train_loss", intervalLoss_ / std::max<int64_t>(intervalSteps_, 1));
    fields.set("lr", engine_.lr());
    fields.update(extra);
    metrics_.write(fields);
  }
  intervalLoss_ = 0.0;
  intervalSteps_ = 0;
}

void FitRecords::showProgress(int64_t stepsThisPass) {
  if (options_.quiet || !primary_ || lossCount_ == 0) return;
  char suffix[96];
  std::snprintf(suffix, sizeof(suffix), "loss %.4f  %s samples/s", lossSum_ / lossCount_,
                formatRate(lossCount_ * options_.batch / std::max(epochSeconds_, 1e-9)).c_str());
  bar_->update(passStart_.batch + stepsThisPass, suffix + breakdown_);
}

EpochEnd FitRecords::endEpoch(const data::LoaderState& at, int64_t stepsDone,
                              const std::optional<EvaluateResult>& validation) {
  trainSeconds_ += epochSeconds_;
  trainSteps_ += lossCount_;
  trainLoss_ = lossSum_ / std::max<int64_t>(lossCount_, 1);
  const double rate = lossCount_ * options_.batch / std::max(epochSeconds_, 1e-9);
  return EpochEnd{.epoch = at.epoch + 1, .step = stepsDone, .trainLoss = trainLoss_,
                  .validation = validation, .samplesPerSecond = rate};
}

void FitRecords::writeEpoch(const EpochEnd& ended) {
  if (!options_.quiet && primary_ && bar_)
    bar_->finish(epochProgressText(ended.trainLoss, ended.validation, ended.samplesPerSecond));
  metrics_.write(epochFields(ended, wallSeconds(), engine_.lr()));
  lossSum_ = epochSeconds_ = 0.0;
  lossCount_ = 0;
}

FitSummary FitRecords::summarize(int64_t stepsDone, comm::Communicator* comm) {
  const int64_t tensorBase = engine_.tensorBytesBefore();
  if (trainSteps_ > 0)
    logger_.info("tensor memory", {{"rank", rank_},
                                   {"state_bytes", stateBytes_ - tensorBase},
                                   {"step_peak_bytes", stepPeakBytes_ - tensorBase}});
  FitSummary summary;
  summary.steps = stepsDone;
  summary.trainLoss = trainLoss_;
  summary.samplesPerSecond = trainSteps_ * options_.batch / std::max(trainSeconds_, 1e-9);
  summary.steadySamplesPerSecond = steadySteps_ > 0
                                       ? steadySteps_ * options_.batch / std::max(steadySeconds_, 1e-9)
                                       : summary.samplesPerSecond;
  if (const parallel::Reducer* reducer = engine_.reducer(); reducer && trainSteps_ > 0)
    summary.gradBytesPerStep = static_cast<double>(reducer->bytesSent()) / trainSteps_;
  summary.ranks = rankFigures_.gather(comm);
  return summary;
}

void FitRecords::writeEnd(const FitSummary& summary, bool validation, const observe::Fields& extra) {
  metrics_.event("end", summary.steps);  // before the final line, which stays the file's last
  observe::Fields last = finalFields(summary, validation);
  last.update(extra);
  last.set("final", true);
  metrics_.write(last);
}

}  // namespace kolo::train::detail
