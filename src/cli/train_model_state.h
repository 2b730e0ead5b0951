// Checkpoints, resume, metrics and the whole model of the model-parallel runs
// (train_pipeline.cc): what each rank holds (a pipeline stage, a tensor-parallel shard, a
// stage's shard, or under fsdp the whole state consolidated from its shards) gathered into
// whole tensors under the model's names, so that a checkpoint is the one one-rank training
// writes, and cut back into each rank's part when a run resumes, whatever its layout.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cli/train_loop.h"
#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"
#include "kolo/observe.h"
#include "kolo/optim.h"
#include "kolo/parallel/mesh.h"
#include "kolo/safetensors.h"

namespace kolo::cli {

/// What one rank holds of the model.
struct ModelPart {
  nn::Module* module = nullptr;  // its layers or shards, under the whole model's names
  std::map<std::string, parallel::ShardSpec>
      specs;  // how its tensors were cut (none: whole tensors)
  optim::Optimizer* optimizer = nullptr;
  int tensorRank = 0, tensorSize = 1;  // its place in its tensor-parallel group
};

/// Collective over `group` (the ranks holding one replica of the model; null: this rank holds
/// all of it): the whole model's state dict on group rank 0, empty elsewhere.
checkpoint::NamedTensors gatherWholeWeights(comm::Communicator* group, const ModelPart& part);

/// Collective over `group` as gatherWholeWeights: on group rank 0 (`writer`), writes the
/// checkpoint of `step` under --checkpoint-dir: the whole weights, the whole optimizer state
/// (of the recipe's optimizer) and the run's identity (model, batch, seed, strategy).
void saveModelCheckpoint(const TrainConfig& config, const Recipe& recipe, comm::Communicator* group,
                         const ModelPart& part, int64_t step, observe::Logger& logger);

/// Collective over `world` (null: one rank): world rank 0 picks the newest good checkpoint
/// under --resume, every rank reads it and copies its part of the weights and of the optimizer
/// state. Returns the step to continue from. Throws FileError when there is no good
/// checkpoint, Mismatch when it was written for another model, batch or seed, and
/// InvalidArgument when a tensor or the optimizer's kind does not fit.
int64_t resumeModelPart(const TrainConfig& config, comm::Communicator* world, const ModelPart& part,
                        observe::Logger& logger);

// --metrics FILE of a model-parallel run (rank 0; no file elsewhere): events (start or
// resume, end), one line per progress interval and the final line, in the records `kolo
// report` reads. A resumed run continues the file.
class RunMetrics {
 public:
  /// No file when `path` is empty; a run resumed at `firstStep` > 0 appends.
  RunMetrics(const std::string& path, int64_t firstStep) {
    if (!path.empty()) writer_ = std::make_unique<observe::MetricsWriter>(path, firstStep > 0);
  }
  void event(const char* name, int64_t step, const observe::Fields& extra = {}) {
    write({{"kind", "event"}, {"event", name}, {"step", step}}, extra);
  }
  void interval(int64_t step, const observe::Fields& values) {
    write({{"kind", "interval"}, {"step", step}}, values);
  }
  void final(int64_t step, const observe::Fields& values) {
    write({{"step", step}, {"final", true}}, values);
  }

 private:
  void write(observe::Fields fields, const observe::Fields& more) {
    if (writer_) writer_->write(fields.update(more));
  }
  std::unique_ptr<observe::MetricsWriter> writer_;
};

}  // namespace kolo::cli
