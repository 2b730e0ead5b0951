#include "kolo/train/report.h"

#include <algorithm>

#include "base/printf_text.h"
#include "kolo/nn/layers.h"
#include "kolo/train/model_parallel.h"

namespace kolo::train {

RankReport rankReport(Engine& engine, const FitSummary& summary) {
  const auto* modelParallel = dynamic_cast<const ModelParallelEngine*>(&engine);
  const parallel::MeshShape shape = modelParallel ? modelParallel->mesh() : parallel::MeshShape{};
  // The layers each stage holds; none named for a model that is not a Sequential.
  std::vector<int> bounds;
  if (modelParallel) {
    bounds = modelParallel->bounds();
  } else if (const auto* sequential = dynamic_cast<const nn::Sequential*>(&engine.model())) {
    bounds = {0, static_cast<int>(sequential->size())};
  }
  // Stages, unless tensor parallelism alone.
  const bool byStage = modelParallel && !(shape.pp == 1 && shape.tp > 1);
  const auto tp = static_cast<size_t>(shape.tp);
  std::vector<RankFigures> ranks = summary.ranks;
  if (modelParallel) ranks.resize(static_cast<size_t>(shape.pp * shape.tp));  // replica 0
  RankReport report;
  double slowest = 0.0, stepTime = 0.0;
  constexpr double kMiB = 1 << 20;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankFigures& f = ranks[r];
    slowest = std::max(slowest, f.computeSeconds);
    stepTime = std::max(stepTime, f.stepSeconds);
    const size_t s = byStage ? r / tp : 0;
    std::string who = byStage ? "stage " + std::to_string(s) : "rank " + std::to_string(r);
    if (byStage && tp > 1) who += " rank " + std::to_string(r % tp);
    who += bounds.empty() ? std::string(":")
                          : detail::printfText(": layers %d-%d", bounds[s], bounds[s + 1] - 1);
    report.ranks.push_back(detail::printfText(
        "%s  compute %.1f ms/step  step %.1f ms  peak micro-batches held %lld  "
        "peak boundary activations %.2f MiB  peak step memory %.2f MiB  peak tensors %.2f MiB  "
        "peak rss %.1f MiB",
        who.c_str(), 1000.0 * f.computeSeconds, 1000.0 * f.stepSeconds,
        static_cast<long long>(f.peakMicroBatchesHeld), f.peakBoundaryBytes / kMiB,
        f.peakStepBytes / kMiB, f.peakTensorBytes / kMiB, f.peakResidentBytes / kMiB));
  }
  if (!modelParallel) {
    const std::shared_ptr<comm::Communicator> world = engine.communicator();
    report.layout =
        detail::printfText("%s ranks %d replicas %d step_ms %.2f", engine.name().c_str(),
                           world ? world->size() : 1, engine.replicas(), 1000.0 * stepTime);
  } else if (!byStage) {
    report.layout = detail::printfText("tensor_parallel ranks %zu step_ms %.2f", ranks.size(),
                                       1000.0 * stepTime);
  } else {
    const ModelParallelOptions& options = modelParallel->options();
    const int m = options.microBatches, stages = shape.pp;
    const double ideal = slowest * (m + stages - 1) / m;
    report.layout = detail::printfText(
        "pipeline stages %d micro_batches %d schedule %s step_ms %.2f ideal_ms %.2f "
        "measured_over_ideal %.3f",
        stages, m, parallel::pipelineScheduleName(options.schedule), 1000.0 * stepTime,
        1000.0 * ideal, ideal > 0 ? stepTime / ideal : 0.0);
  }
  return report;
}

}  // namespace kolo::train
