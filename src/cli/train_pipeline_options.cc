// The `kolo train` flags of the `lm` model and of pipeline parallelism, kept apart from
// train_command.cc so that the data-parallel flags and these do not share one list.
#include <CLI/CLI.hpp>
#include "cli/options.h"
#include "cli/train_loop.h"

namespace kolo::cli {

void addModelParallelOptions(CLI::App* app, TrainConfig& config) {
  app->add_option("--layers", config.layers, "lm: transformer blocks")->capture_default_str()->check(atLeast(1));
  app->add_option("--d-model", config.dModel, "lm: embedding width")->capture_default_str()->check(atLeast(1));
  app->add_option("--heads", config.heads, "lm: attention heads (must divide --d-model)")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--seq-len", config.seqLen, "lm: context length in bytes")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--stages", config.stages,
                  "pipeline: stages, one rank each (run under kolo run -n STAGES)")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--tp", config.tp,
                  "tensor: ranks the split layers are spread over (run under kolo run -n TP)")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_flag(
      "--sequence-parallel", config.sequenceParallel,
      "tensor, lm: LayerNorms and residuals hold seq-len/tp of the tokens on each rank (all-gather "
      "before the column-parallel layers, reduce-scatter after the row-parallel ones)");
  app->add_option("--mesh", config.mesh,
                  "hybrid: dp=D,pp=P (D replicas of a P-stage pipeline) or dp=D,tp=T; gradients are "
                  "averaged between replicas; run under kolo run -n D*P (or D*T)");
  app->add_option("--micro-batches", config.microBatches,
                  "pipeline: micro-batches per step (--batch must be a multiple)")
      ->capture_default_str()
      ->check(atLeast(1));
  app->add_option("--pipeline-schedule", config.pipelineSchedule,
                  "pipeline: gpipe or 1f1b (also --schedule gpipe|1f1b, when no lr schedule is named)")
      ->check(oneOf({"gpipe", "1f1b"}))
      ->capture_default_str();
  app->add_option("--split-at", config.splitAt,
                  "pipeline: first layer of stages 2..P, e.g. 3,6 (default: split by measured layer cost)");
  app->add_flag("--recompute", config.recompute,
                "activation checkpointing: keep only each top-level layer's input (pipeline: each "
                "micro-batch's stage input) and compute its forward again before its backward");
  app->add_option("--memory-limit", config.memoryLimit,
                  "tensor memory budget of each rank, e.g. 512M: an allocation past it ends the run "
                  "with an error naming the tensor and the bytes");
  app->add_option("--sample-bytes", config.sampleBytes, "lm: bytes of text generated at the end")
      ->capture_default_str()
      ->check(atLeast(0));
}

}  // namespace kolo::cli
