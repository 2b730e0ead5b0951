// resumeModelPart: the newest good checkpoint under --resume, read by every rank, checked
// against the run's identity, and cut into this rank's part.
#include "cli/train_model_state.h"

#include "kolo/checkpoint.h"
#include "kolo/error.h"
#include "train/model_parts.h"

namespace kolo::cli {

int64_t resumeModelPart(const TrainConfig& config, comm::Communicator* world, const ModelPart& part,
                        observe::Logger& logger) {
  checkpoint::CheckpointManager manager(config.resumeDir, config.keepCheckpoints, false,
                                        [&logger](const std::string& line) { logger.warn(line); });
  // World rank 0 decides which checkpoint, so that every rank reads the same one.
  int64_t step = -1;
  if (!world || world->rank() == 0) {
    const auto found = manager.latestGood();
    if (found) step = found->step;
  }
  if (world && world->size() > 1) world->broadcast(&step, 1, DType::I64, 0);
  if (step < 0) KOLO_THROW(FileError, "--resume ", config.resumeDir, ": no good checkpoint there");
  std::string path;
  for (const auto& info : manager.list())
    if (info.step == step) path = info.path;
  KOLO_REQUIRE(!path.empty(), "--resume ", config.resumeDir, ": the checkpoint of step ", step,
               " went away");
  const checkpoint::CheckpointContents contents = checkpoint::CheckpointManager::read(path);
  for (const auto& [key, value] : runIdentity(config)) {
    const auto it = contents.state.extra.find(key);
    if (it != contents.state.extra.end() && it->second != value)
      KOLO_THROW(Mismatch, "--resume ", path, ": the checkpoint was written with ", key, " ",
                 it->second, ", this run has ", value);
  }
  const train::detail::WholeState whole{
      contents.weights, contents.optimizerKind,
      optim::StateDict::fromFlat(contents.optimizerTensors, contents.optimizerScalars)};
  try {
    train::detail::loadPart(whole, {part.module, part.optimizer, part.specs, part.tensorRank, part.tensorSize});
  } catch (const Mismatch& e) {
    KOLO_THROW(Mismatch, "--resume ", path, ": ", e.what());
  }
  logger.info("resuming", {{"checkpoint", path}, {"step", step}});
  return step;
}

}  // namespace kolo::cli
