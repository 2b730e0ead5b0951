// Whole tensors from the ranks' parts (checkpoints, the final weights) and the parts cut back
// from a checkpoint's whole tensors (resume). Optimizer slots that are per-element companions
// of a parameter (momentum, Adam's moments) are cut and reassembled as their parameter is;
// anything else (a per-parameter step count) is the same on every rank and taken whole.
#include "cli/train_model_state.h"

#include <algorithm>

#include "kolo/checkpoint.h"
#include "kolo/error.h"

namespace kolo::cli {
namespace {

parallel::ShardSpec specOf(const ModelPart& part, const std::string& name) {
  const auto found = part.specs.find(name);
  return found == part.specs.end() ? parallel::ShardSpec{} : found->second;
}

std::map<std::string, Shape> localShapes(const ModelPart& part) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : part.module->namedParameters()) shapes[name] = t.shape();
  return shapes;
}

std::vector<parallel::ModelPiece> weightPieces(const ModelPart& part) {
  std::vector<parallel::ModelPiece> pieces;
  for (const auto& [name, t] : part.module->stateDict())
    pieces.push_back({name, t, specOf(part, name)});
  return pieces;
}

// "<parameter>/<slot>" pieces of the optimizer state.
std::vector<parallel::ModelPiece> optimizerPieces(const ModelPart& part,
                                                  const optim::StateDict& state) {
  const std::map<std::string, Shape> shapes = localShapes(part);
  std::vector<parallel::ModelPiece> pieces;
  for (const auto& [name, slots] : state.perParameter) {
    const Shape& shape = shapes.at(name);
    for (const auto& [slot, t] : slots) {
      const bool companion = t.numel() == shapeNumel(shape);
      pieces.push_back({name + "/" + slot, companion ? t.reshape(shape) : t,
                        companion ? specOf(part, name) : parallel::ShardSpec{}});
    }
  }
  return pieces;
}

checkpoint::NamedTensors gatherPieces(comm::Communicator* group,
                                      const std::vector<parallel::ModelPiece>& pieces) {
  if (group) return parallel::gatherWholeTensors(*group, pieces, 0);
  checkpoint::NamedTensors whole;
  for (const auto& piece : pieces) whole.emplace_back(piece.name, piece.tensor);
  return whole;
}

Tensor wholeTensor(const checkpoint::NamedTensors& tensors, const std::string& name,
                   const std::string& path) {
  for (const auto& entry : tensors)
    if (entry.first == name) return entry.second;
  KOLO_THROW(InvalidArgument, "--resume ", path, ": the checkpoint has no tensor ", name);
}

}  // namespace

checkpoint::NamedTensors gatherWholeWeights(comm::Communicator* group, const ModelPart& part) {
  return gatherPieces(group, weightPieces(part));
}

void saveModelCheckpoint(const TrainConfig& config, const Recipe& recipe, comm::Communicator* group,
                         const ModelPart& part, int64_t step, observe::Logger& logger) {
  const checkpoint::NamedTensors weights = gatherWholeWeights(group, part);
  const optim::StateDict state = part.optimizer->stateDict();
  const checkpoint::NamedTensors slots = gatherPieces(group, optimizerPieces(part, state));
  if (group && group->rank() != 0) return;
  // The whole model's optimizer holding the whole state: the checkpoint one-rank training writes.
  std::unique_ptr<optim::Optimizer> whole = makeOptimizer(recipe, weights);
  whole->loadStateDict(optim::StateDict::fromFlat(slots, state.scalars));
  checkpoint::TrainingState training;
  training.step = step;
  training.extra = runIdentity(config);
  training.extra["strategy"] = config.mesh.empty() ? config.strategy : "mesh " + config.mesh;
  checkpoint::CheckpointManager manager(config.checkpointDir, config.keepCheckpoints, true,
                                        [&logger](const std::string& line) { logger.warn(line); });
  const std::string path = manager.save(weights, whole.get(), training);
  logger.debug("checkpoint written", {{"dir", path}, {"step", step}});
}

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

  // Weights: this rank's part of every tensor it holds.
  for (const auto& [name, mine] : part.module->stateDict()) {
    const Tensor piece =
        parallel::pieceOfWhole(wholeTensor(contents.weights, name, path), specOf(part, name),
                               part.tensorRank, part.tensorSize);
    KOLO_REQUIRE(piece.shape() == mine.shape(), "--resume ", path, ": ", name, " has ",
                 shapeString(piece.shape()), " for this rank, which holds ",
                 shapeString(mine.shape()));
    Tensor(mine).copyFrom(piece);
  }
  // The optimizer state of those parameters, cut alike.
  KOLO_REQUIRE(contents.optimizerKind == part.optimizer->kind(), "--resume ", path,
               ": the checkpoint holds ",
               contents.optimizerKind.empty() ? "no" : contents.optimizerKind,
               " optimizer state, this run uses ", part.optimizer->kind());
  const optim::StateDict saved =
      optim::StateDict::fromFlat(contents.optimizerTensors, contents.optimizerScalars);
  optim::StateDict local;
  local.scalars = saved.scalars;
  for (const auto& [name, shape] : localShapes(part)) {
    const auto slots = saved.perParameter.find(name);
    if (slots == saved.perParameter.end()) continue;
    const Tensor whole = wholeTensor(contents.weights, name, path);
    for (const auto& [slot, t] : slots->second) {
      local.perParameter[name][slot] =
          t.numel() == whole.numel()
              ? parallel::pieceOfWhole(t.reshape(whole.shape()), specOf(part, name),
                                       part.tensorRank, part.tensorSize)
              : t;
    }
  }
  part.optimizer->loadStateDict(local);
  logger.info("resuming", {{"checkpoint", path}, {"step", step}});
  return step;
}

}  // namespace kolo::cli
