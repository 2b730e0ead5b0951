// The per-rank report of a finished train::fit: where the time and the memory went, rank by
// rank, and the layout's step time (for a pipeline, against its schedule's ideal).
#pragma once

#include <string>
#include <vector>

#include "kolo/train/engine.h"
#include "kolo/train/fit.h"

namespace kolo::train {

/// Lines to print (kolo train prints `ranks` on stderr, `layout` on stdout, rank 0 only).
struct RankReport {
  /// One line per rank of replica 0's model group (the other replicas hold the same): who
  /// (stage s [rank t] of a pipeline or mesh, rank r otherwise), the layers it holds, compute
  /// and step time per step, peak micro-batches held, boundary activations, step memory,
  /// tensors and resident memory (FitSummary::ranks).
  std::vector<std::string> ranks;
  /// The slowest rank's step time under the layout: "NAME ranks R replicas N step_ms S" for
  /// data parallelism (NAME: Engine::name()), "tensor_parallel ranks T step_ms S" for tensor
  /// parallelism alone, else "pipeline stages P micro_batches M schedule NAME step_ms S
  /// ideal_ms I measured_over_ideal X", the ideal being the slowest stage's compute times
  /// (M + P − 1) / M.
  std::string layout;
};

/// The report of `summary`, fit's result for `engine`; on rank 0 after fit returns (the
/// figures are every rank's). A data-parallel engine's model counts as one stage (its
/// top-level layers named when it is an nn::Sequential, none otherwise: "rank 0:  compute …").
RankReport rankReport(Engine& engine, const FitSummary& summary);

}  // namespace kolo::train
